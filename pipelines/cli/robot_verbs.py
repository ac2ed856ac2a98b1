"""Verbs for robots outside the simulator: ``twin``, our simulated arm as a ROS 2 robot (what
an edge agent's ``robots.ros2.driver:ros2_robot`` driver connects to when no arm is at hand)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.common import console
from pipelines.cli.options import add_verb

ROS2_TWIN_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ros2" / "rp5-twin.yaml"


def twin(
    ros_config: Annotated[
        Path,
        typer.Option(
            "--ros-config",
            help="The ROS 2 robot config: robot, joint names, topics (the driver reads the same "
            "file).",
            show_default="configs/ros2/rp5-twin.yaml",
        ),
    ] = ROS2_TWIN_CONFIG,
    task: Annotated[
        str, typer.Option(help="The scene's task ([FAMILY/]VARIANT; robo-pipe scenes lists them).")
    ] = "touch-mixed",
    seed: Annotated[
        int, typer.Option(help="Seed of the first episode (a driver's reset sets the next).")
    ] = 0,
    image_size: Annotated[
        int, typer.Option(min=16, max=512, help="Camera images published, px (square).")
    ] = 64,
) -> None:
    """Run the digital twin: the simulated arm as a ROS 2 robot. It publishes joint states,
    camera images and its episode's status at the robot's control rate and follows position
    commands, as a ros2_control arm does; an edge agent whose driver is
    ``robots.ros2.driver:ros2_robot`` with this config drives it. Ctrl-C or SIGTERM stops it.
    Needs rclpy (``pip install 'robo-pipe[ros]'``)."""
    from pipelines.services.signals import interrupted_exit_code, stop_on_sigterm
    from robots.ros2.config import load_ros2_config
    from sim_scenes.tasks import resolve_task

    config, spec = load_ros2_config(ros_config)
    resolve_task(task)  # an unknown task is named before anything starts
    from sim_scenes.twin import Twin  # imports rclpy: Ros2Unavailable names the fix

    arm = Twin(config, spec, task, image_size)
    t = config.topics
    console.print(
        f"twin: {spec.name} on {task} at {spec.control_hz:g} Hz: publishing {t.joint_states}, "
        f"{', '.join(t.cameras.values())}, {t.episode}; following {t.command}",
        highlight=False,
    )
    stop = threading.Event()
    stop_on_sigterm()
    try:
        arm.run(stop, seed)
    except KeyboardInterrupt as stopped:
        s = arm.status
        console.print(
            f"twin stopped: {s.episodes} episodes, {s.steps} steps, {s.commands} commands, "
            f"{s.late_steps} late steps",
            highlight=False,
        )
        raise typer.Exit(code=interrupted_exit_code(stopped)) from None


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        app,
        twin,
        "robo-pipe twin",
        "robo-pipe twin --task touch-single --ros-config my-arm.yaml",
    )
