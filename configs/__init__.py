"""The YAML files robo-pipe ships, as package data.

    configs/<name>.yaml           pipeline configs (``demo.yaml``, ``demo-wrist.yaml``...), read by
                                  :mod:`pipelines.config`
    configs/targets/<name>.yaml   target profiles for the latency gate (``local-cpu``,
                                  ``jetson-orin-nano``...), read by :mod:`deploy_edge.targets`
    configs/ros2/<name>.yaml      ROS 2 robot configs (the twin's) and rosbag mappings, read by
                                  :mod:`robots.ros2.config` and :mod:`stages.ingest.mapping`

They are found through this package, not relative to the source tree, so an installed
robo-pipe (a wheel, not an editable checkout) finds them too. Imports only the standard library.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def config_dir() -> Path:
    """The directory of the shipped pipeline configs (``*.yaml``)."""
    root = files(__name__)
    if not isinstance(root, Path):  # e.g. imported from a zip file: no directory to glob
        raise RuntimeError(f"{__name__}: installed without a directory on disk ({root!r})")
    return root


def ros2_dir() -> Path:
    """The directory of the shipped ROS 2 robot configs and rosbag mappings (``ros2/*.yaml``)."""
    return config_dir() / "ros2"


def targets_dir() -> Path:
    """The directory of the shipped target profiles (``targets/*.yaml``)."""
    return config_dir() / "targets"
