"""LeRobot v3 datasets: layout, atomic writing, validated reading, video streams."""

from stages.dataset.layout import DatasetRef, content_hash
from stages.dataset.reader import LeRobotDataset, open_dataset
from stages.dataset.writer import DatasetError

__all__ = ["DatasetError", "DatasetRef", "LeRobotDataset", "content_hash", "open_dataset"]
