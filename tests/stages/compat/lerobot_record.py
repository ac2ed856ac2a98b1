"""Run under a Python that has ``lerobot`` installed: record a dataset with LeRobot's own
recorder API (``LeRobotDataset.create``, ``add_frame``, ``save_episode``, ``finalize``), as a
lab's arm would record one.

Usage: python lerobot_record.py OUT JSON_SPEC [OUT JSON_SPEC ...] (one process: LeRobot takes
seconds to import), each spec holding ``fps``, ``state_names``,
``action_names``, ``cameras`` (name -> [height, width]), ``state_scale`` (1 for rad, 57.3 for
degrees), ``episodes``, ``frames``. Kept free of robo-pipe imports (LeRobot's Python 3.12).
"""

import json
import sys

import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset


def record(out: str, spec: dict) -> None:
    n_state, n_action = len(spec["state_names"]), len(spec["action_names"])
    features = {
        "observation.state": {
            "dtype": "float32",
            "shape": (n_state,),
            "names": spec["state_names"],
        },
        "action": {"dtype": "float32", "shape": (n_action,), "names": spec["action_names"]},
    }
    for camera, (height, width) in spec["cameras"].items():
        features[f"observation.images.{camera}"] = {
            "dtype": "video",
            "shape": (height, width, 3),
            "names": ["height", "width", "channels"],
        }
    dataset = LeRobotDataset.create("lab/arm", fps=spec["fps"], features=features, root=out)
    rng = np.random.default_rng(0)
    home = np.array(spec["home"], dtype=np.float32)
    for _ in range(spec["episodes"]):
        for t in range(spec["frames"]):
            state = (home + 0.05 * np.sin(t / 5 + np.arange(n_state))) * spec["state_scale"]
            frame = {
                "observation.state": state.astype(np.float32),
                "action": (0.02 * rng.standard_normal(n_action)).astype(np.float32),
                "task": "touch the red cube",
            }
            for camera, (height, width) in spec["cameras"].items():
                frame[f"observation.images.{camera}"] = rng.integers(
                    0, 255, (height, width, 3), np.uint8
                )
            dataset.add_frame(frame)
        dataset.save_episode()
    dataset.finalize()
    print(json.dumps({"episodes": dataset.num_episodes, "frames": dataset.num_frames}))


for k in range(1, len(sys.argv), 2):
    record(sys.argv[k], json.loads(sys.argv[k + 1]))
