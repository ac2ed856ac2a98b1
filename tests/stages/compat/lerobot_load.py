"""Run under a Python that has ``lerobot`` installed: load a dataset with LeRobot's own reader.

Usage: python lerobot_load.py DATASET_DIR; prints one JSON line with what LeRobot saw.
Kept free of robo-pipe imports so it runs in LeRobot's environment (Python 3.12).
"""

import json
import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root = sys.argv[1]
ds = LeRobotDataset("local/robo-pipe-compat", root=root)
items = [ds[i] for i in (0, len(ds) // 2, len(ds) - 1)]
camera_keys = list(ds.meta.camera_keys)
print(
    json.dumps(
        {
            "num_frames": ds.num_frames,
            "num_episodes": ds.num_episodes,
            "fps": ds.fps,
            "camera_keys": camera_keys,
            "tasks": [item["task"] for item in items],
            "state": [item["observation.state"].numpy().tolist() for item in items],
            "action": [item["action"].numpy().tolist() for item in items],
            "index": [int(item["index"]) for item in items],
            "frame_index": [int(item["frame_index"]) for item in items],
            "timestamp": [float(item["timestamp"]) for item in items],
            # the decoded frames themselves (float CHW in [0, 1]): found by timestamp
            "images": [item[camera_keys[0]].numpy().tolist() for item in items]
            if camera_keys
            else [],
            "image_shape": list(items[0][camera_keys[0]].shape) if camera_keys else None,
            "image_mean": [
                float(np.asarray(item[k]).mean()) for item in items for k in camera_keys
            ],
            "stats_keys": sorted(ds.meta.stats),
        }
    )
)
