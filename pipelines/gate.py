"""The robot the latency gate drives: the config's simulated robot, seeing what the export needs."""

from __future__ import annotations

from pathlib import Path

from deploy_edge.exported import read_io_spec
from pipelines.config import PipelineConfig
from robots.spec import get_robot
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import get_variant


def gate_robot(cfg: PipelineConfig, export_dir: str | Path) -> tuple[SimulatedRobot, str]:
    """The simulated robot of ``cfg`` with the export's cameras and image size, and the
    instruction of its first episode (the gate runs the control loop on one instruction)."""
    spec = read_io_spec(export_dir)
    robot = SimulatedRobot(
        get_robot(cfg.robot),
        get_variant(cfg.scene.variant),
        seed=cfg.seed,
        cameras=tuple(spec["cameras"]),
        image_size=int(spec["image_size"]),
    )
    robot.connect()
    instruction = robot.instruction
    robot.stop()
    return robot, instruction
