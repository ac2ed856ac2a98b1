"""Verbs for robots outside the simulator: ``twin``, our simulated arm as a ROS 2 robot (what
an edge agent's ``robots.ros2.driver:ros2_robot`` driver connects to when no arm is at hand, and
with ``--expert --record`` a rosbag of it driven by the scripted expert); ``import rosbag``, a
robot's bag, and ``import lerobot``, a LeRobot dataset recorded elsewhere, into datasets the
pipeline trains on."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from configs import ros2_dir
from pipelines.cli.common import console, emit_json, result_console
from pipelines.cli.options import JsonOpt, VerbGroup, add_verb, epilog

if TYPE_CHECKING:
    from robots.ros2.config import Ros2RobotConfig
    from robots.spec import RobotSpec
    from sim_scenes.twin_record import Recording

ROS2_TWIN_CONFIG = ros2_dir() / "rp5-twin.yaml"


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
    expert: Annotated[
        bool,
        typer.Option(
            help="Drive the arm with the task's scripted expert in simulated time (no ROS peer) "
            "and record it to --record: what an operator's teleoperation session gives a lab."
        ),
    ] = False,
    record: Annotated[
        Path | None,
        typer.Option(
            help="With --expert: the new rosbag2 folder (MCAP, zstd).", show_default=False
        ),
    ] = None,
    episodes: Annotated[int, typer.Option(min=1, help="With --expert: episodes to record.")] = 20,
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
    if expert or record is not None:
        _record(config, spec, task, seed, image_size, record if expert else None, episodes)
        return
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


def _record(
    config: Ros2RobotConfig,
    spec: RobotSpec,
    task: str,
    seed: int,
    image_size: int,
    bag: Path | None,
    episodes: int,
) -> None:
    """``twin --expert --record BAG``: the recording, with a line per episode."""
    from robo_pipe.errors import InputError
    from sim_scenes.twin_record import record_expert

    if bag is None:
        raise InputError("--expert records a bag: give --record BAG (and --expert with --record)")
    if bag.exists():
        raise InputError(f"--record {bag}: exists; a bag is never overwritten")
    if not config.topics.episode:
        raise InputError("--ros-config: the recording needs topics.episode (the twin's status)")

    def said(done: Recording) -> None:
        console.print(
            f"episode {done.episodes}/{episodes}: {done.solved} solved, {done.frames} frames, "
            f"{done.bytes / 1e6:.1f} MB",
            highlight=False,
        )

    done = record_expert(config, spec, task, episodes, seed, bag, image_size, on_episode=said)
    result_console(False).print(
        f"recorded {bag}: {done.episodes} episodes ({done.solved} solved)", highlight=False
    )


def import_rosbag(
    bag: Annotated[Path, typer.Argument(help="The rosbag2 folder (MCAP or sqlite3).")],
    mapping: Annotated[
        Path,
        typer.Option(
            help="Which topics are the state, cameras, action and episodes, and how "
            "(configs/ros2/rp5-twin-bag.yaml reads the twin's bags).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="The new dataset's folder (default: the home's datasets/<bag name>).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Import a robot's rosbag as a LeRobot v3 dataset the pipeline trains on (robo-pipe
    finetune --dataset DIR). One frame per reference message; every other feature as of the
    frame's time within max_age_s (never a later message), else the frame is dropped; episodes
    split by the mapping's rule; a report of frames kept and dropped, per-topic rates and gaps.
    Every mistake in the mapping or the bag is named before anything is decoded, and a corrupt
    bag writes nothing."""
    from pipelines.home import home_dir
    from stages.ingest.mapping import load_mapping
    from stages.ingest.rosbag import check_output
    from stages.ingest.rosbag import import_rosbag as run_import

    settings, spec = load_mapping(mapping)
    target = (out or home_dir("datasets") / bag.name).resolve()
    check_output(target)
    ref, report = run_import(bag, settings, spec, target, on_status=lambda m: console.print(m))
    table = Table(title=f"{bag.name} -> {target}")
    for column in ("topic", "role", "messages", "rate (Hz)", "largest gap (s)"):
        table.add_column(column)
    for t in report.topics:
        table.add_row(t.topic, t.role, f"{t.messages:,}", f"{t.rate_hz:.1f}", f"{t.max_gap_s:.2f}")
    out_console = result_console(json_out)
    out_console.print(table)
    dropped = ", ".join(f"{n:,} {why}" for why, n in report.dropped.items()) or "none"
    out_console.print(
        f"{report.kept:,} of {report.frames:,} frames kept in {report.episodes} episodes at "
        f"{report.fps:.1f} Hz; dropped: {dropped}",
        highlight=False,
    )
    emit_json(ref, json_out)


def import_lerobot(
    source: Annotated[
        Path, typer.Argument(help="The LeRobot v3 dataset's folder (meta/info.json).")
    ],
    robot: Annotated[
        str, typer.Option(help="The robot it was recorded on (robo-pipe robots).")
    ] = "rp5",
    name: Annotated[
        str | None,
        typer.Option(
            help="Its name in the home's datasets (default: the folder's).", show_default=False
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Register a LeRobot v3 dataset recorded elsewhere (LeRobot's recorder on a real arm) as a
    dataset the pipeline fine-tunes on (robo-pipe finetune --dataset DIR). It is checked against
    the robot first: rate, state and action names and shapes, cameras (square, one size) and
    units (each value's recorded range against the robot's limits); every mismatch is named,
    field by field, and nothing is written. The source is never changed: the home gets a copy
    (hard links where the disk allows) with robo-pipe's checksums."""
    from pipelines.home import home_dir
    from robots.spec import get_robot
    from stages.ingest.lerobot import import_lerobot as run_import

    spec = get_robot(robot)
    target = home_dir("datasets") / (name or source.resolve().name)
    ref = run_import(source, spec, target)
    result_console(json_out).print(
        f"registered {target}: {ref.episodes} episodes, {ref.frames:,} frames at {ref.fps:g} Hz "
        f"for {spec.name}",
        highlight=False,
    )
    emit_json(ref, json_out)


imports = typer.Typer(
    cls=VerbGroup,
    help="Robot data from outside the simulator into the home's datasets.",
    no_args_is_help=True,
    epilog=epilog(
        ("robo-pipe import rosbag BAG --mapping arm-bag.yaml", "robo-pipe import lerobot DIR")
    ),
)


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        app,
        twin,
        "robo-pipe twin",
        "robo-pipe twin --task touch-single --ros-config my-arm.yaml",
        "robo-pipe twin --expert --episodes 50 --record bags/expert-50",
    )
    add_verb(
        imports,
        import_rosbag,
        "robo-pipe import rosbag bags/expert-50 --mapping configs/ros2/rp5-twin-bag.yaml",
        name="rosbag",
    )
    add_verb(
        imports,
        import_lerobot,
        "robo-pipe import lerobot ~/lerobot-data/lab-arm --robot rp5",
        name="lerobot",
    )
    app.add_typer(imports, name="import")
