"""LeRobot v3 datasets: layout, atomic writing, validated reading, video streams."""

from stages.dataset.layout import DatasetError, DatasetRef, content_hash
from stages.dataset.reader import LeRobotDataset, open_dataset

__all__ = ["DatasetError", "DatasetRef", "LeRobotDataset", "content_hash", "open_dataset"]
