"""``robo-pipe import rosbag``: a rosbag2 of a robot -> a LeRobot v3 dataset the pipeline trains on.

    check     the mapping against the robot, the bag against the mapping (its index and each
              topic's first message): every mistake named before anything is decoded
    read      every mapped message decoded once (:func:`~stages.ingest.bag.read_series`)
    frames    one per ``every``-th reference message; each feature as of the frame's time
              within ``max_age_s`` (:mod:`stages.ingest.align`), else the frame is dropped
    episodes  split where the episode topic's id changes, where the reference pauses longer
              than ``gap_s``, and at a dropped frame (frames of an episode stay evenly spaced)
    actions   the command in effect over the frame's period (the newest at or before the next
              frame: the controller's answer to the frame), as the robot's action from the
              frame's state; or the next frame's state
    write     shards, then the v3 layout (:func:`~stages.dataset.writer.finalize`), with the
              report in ``meta/robo_pipe.json``; nothing is written before the whole bag read

The frames' rate must be the robot's control rate (within ``rate_tolerance``): the policy runs
at that rate, so its training data must be sampled at it.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.errors import InputError
from robots.ros2.joints import JointOrder
from robots.spec import RobotSpec
from stages.dataset.layout import INFO_PATH, STAGING_DIR, DatasetRef
from stages.dataset.reader import dataset_ref
from stages.dataset.shards import EpisodeBuffer, shard_name, write_shard
from stages.dataset.writer import DatasetSchema, finalize
from stages.ingest.align import as_of, runs
from stages.ingest.bag import BagError, Series, check_bag, read_series
from stages.ingest.mapping import RosbagMapping
from stages.provenance import code_version

EPISODES_PER_SHARD = 50


@dataclass
class TopicReport:
    """One mapped topic in the bag."""

    topic: str
    role: str
    messages: int
    rate_hz: float
    max_gap_s: float


@dataclass
class ImportReport:
    """What ``import rosbag`` made of a bag (printed, and kept in ``meta/robo_pipe.json``)."""

    bag: str
    dataset: str
    frames: int
    """Candidate frames: every ``every``-th reference message."""
    kept: int
    """Frames written."""
    episodes: int
    dropped: dict[str, int] = field(default_factory=dict)
    """Why frames were dropped -> how many (a frame can have several reasons)."""
    topics: list[TopicReport] = field(default_factory=list)
    fps: float = 0.0
    """The frames' measured rate, Hz."""


def check_output(out: Path) -> None:
    """``out`` may receive a new dataset: absent, empty, or an interrupted import's (only our
    staging folder in it). A dataset already there is never replaced."""
    if (out / INFO_PATH).is_file():
        raise InputError(f"{out}: a dataset is already there; choose another --out or delete it")
    if out.exists() and (not out.is_dir() or {p.name for p in out.iterdir()} - {STAGING_DIR}):
        raise InputError(f"{out}: exists and is not an empty folder; choose another --out")


def import_rosbag(
    bag: Path,
    mapping: RosbagMapping,
    spec: RobotSpec,
    out: Path,
    on_status: Callable[[str], None] | None = None,
) -> tuple[DatasetRef, ImportReport]:
    """The dataset ``out`` from ``bag`` as ``mapping`` says (see the module docstring).

    Raises:
        BagError: the bag does not fit the mapping, or is corrupt (nothing written).
        InputError: ``out`` holds something already.
    """
    say = on_status or (lambda _: None)
    check_output(out)
    counts = check_bag(bag, mapping, spec)
    say(f"reading {sum(counts.values()):,} messages of {len(counts)} topics")
    series = read_series(bag, mapping, spec)
    episodes, report = episodes_of(series, mapping, spec, bag, out)
    if not episodes:
        raise BagError(f"{bag}: no episode of two frames or more ({_dropped_text(report)})")
    say(f"writing {report.kept:,} frames in {len(episodes)} episodes")
    _write(out, episodes, mapping, spec, report)
    return dataset_ref(out, spec.name, "rosbag", "rosbag"), report


def episodes_of(
    series: dict[str, Series], mapping: RosbagMapping, spec: RobotSpec, bag: Path, out: Path
) -> tuple[list[EpisodeBuffer], ImportReport]:
    """The bag's episodes: frames, features as of each frame, splits, actions."""
    ref = series[mapping.reference]
    frame_ns = ref.ns[:: mapping.every]
    fps = ref.rate_hz / mapping.every
    if abs(fps - spec.control_hz) > mapping.rate_tolerance * spec.control_hz:
        suggest = max(1, round(ref.rate_hz / spec.control_hz))
        raise BagError(
            f"{bag}: frames at {fps:.1f} Hz ({mapping.reference} at {ref.rate_hz:.1f} Hz, every "
            f"{mapping.every}), robot {spec.name} runs at {spec.control_hz:g} Hz: set every: "
            f"{suggest}, or take another reference topic"
        )
    max_age = int(mapping.max_age_s * 1e9)
    sampled = {"state": as_of(frame_ns, series[mapping.state.topic].ns, max_age)}
    for camera, topic in mapping.cameras.items():
        sampled[f"camera {camera}"] = as_of(frame_ns, series[topic].ns, max_age)
    for name, extra in mapping.extras.items():
        sampled[f"extra {name}"] = as_of(frame_ns, series[extra.topic].ns, max_age)
    if mapping.env_state is not None:
        sampled["env_state"] = as_of(frame_ns, series[mapping.env_state.topic].ns, max_age)
    if mapping.action.source == "command" and mapping.action.topic:
        # A frame's action is the command in effect over its period: the newest at or before
        # the next frame's time (the controller answers a frame after it). A position command
        # holds until the next: any age, but one must have been sent.
        period = int(1e9 * mapping.every / ref.rate_hz) if ref.rate_hz else 0
        sampled["action"] = as_of(frame_ns + period, series[mapping.action.topic].ns, None)
    state = series[mapping.state.topic]
    complete = np.array([not np.any(np.isnan(v)) for v in state.values], dtype=bool)
    keep = np.ones(len(frame_ns), dtype=bool)
    dropped: dict[str, int] = {}
    for name, found in sampled.items():
        ok = found.ok & (complete[found.index] if name == "state" else True)
        reason = (
            f"no {name} within {mapping.max_age_s:g} s" if name != "action" else "no command yet"
        )
        if n := int(np.sum(~ok)):
            dropped[reason] = n
        keep &= ok

    starts = np.zeros(len(frame_ns), dtype=bool)
    if len(frame_ns):
        starts[0] = True
        starts[1:] |= np.diff(frame_ns) > mapping.episodes.gap_s * 1e9
    status: list[dict[str, Any]] = [{}] * len(frame_ns)
    if mapping.episodes.topic:
        statuses = series[mapping.episodes.topic]
        found = as_of(frame_ns, statuses.ns, None)
        status = [statuses.values[k] if k >= 0 else {} for k in found.index]
        ids = [s.get("episode") for s in status]
        starts[1:] |= np.array([a != b for a, b in itertools.pairwise(ids)], bool)
        no_episode = np.array([not s.get("episode") for s in status], dtype=bool)
        if n := int(np.sum(no_episode & keep)):
            dropped["outside an episode"] = n
        keep &= ~no_episode

    spans = runs(keep, starts)
    if mapping.action.source == "next_state":
        if n := sum(1 for _ in spans):
            dropped["last frame (no next state)"] = n
        spans = [(a, b - 1) for a, b in spans]
    spans = [(a, b) for a, b in spans if b - a >= 2]
    episodes = [
        _episode(k, a, b, series, sampled, status, mapping, spec) for k, (a, b) in enumerate(spans)
    ]
    truth = episodes[0].env_state if episodes else None
    if truth is not None and truth.shape[1] != len(mapping.env_state_names):
        raise BagError(
            f"{bag}: env_state has {truth.shape[1]} values a frame, env_state_names "
            f"{mapping.env_state_names} names {len(mapping.env_state_names)}"
        )
    report = ImportReport(
        bag=str(bag),
        dataset=str(out),
        frames=len(frame_ns),
        kept=sum(e.length for e in episodes),
        episodes=len(episodes),
        dropped=dropped,
        topics=[
            TopicReport(t, role, len(series[t].ns), series[t].rate_hz, series[t].max_gap_s)
            for t, role in mapping.topics().items()
        ],
        fps=fps,
    )
    return episodes, report


def _episode(
    number: int,
    a: int,
    b: int,
    series: dict[str, Series],
    sampled: dict[str, Any],
    status: list[dict[str, Any]],
    mapping: RosbagMapping,
    spec: RobotSpec,
) -> EpisodeBuffer:
    """Frames ``[a, b)`` as one episode (``b`` included as the next state of ``b - 1`` when the
    actions are next states)."""
    joints = JointOrder(spec)  # the robot's order: read_series maps the state to it
    frames = np.arange(a, b)
    positions = series[mapping.state.topic].values
    end = b + 1 if mapping.action.source == "next_state" else b
    joint = np.stack([positions[sampled["state"].index[k]] for k in range(a, end)])
    state = joints.state(joint)
    if mapping.action.source == "command":
        commands = series[mapping.action.topic or ""].values
        order = mapping.command_order(spec)
        target = np.stack([commands[sampled["action"].index[k]] for k in frames])
        target = target[:, [order.index(name) for name in joints.order]]  # -> the robot's order
    else:
        target = joint[1:]
    action = joints.action(target, joint[: len(frames)]).astype(np.float32)
    images = {
        camera: np.stack(
            [series[topic].values[sampled[f"camera {camera}"].index[k]] for k in frames]
        )
        for camera, topic in mapping.cameras.items()
    }
    extras = {
        name: np.stack(
            [series[extra.topic].values[sampled[f"extra {name}"].index[k]] for k in frames]
        ).astype(np.float32)
        for name, extra in mapping.extras.items()
    }
    env_state = None
    if mapping.env_state is not None:
        truth = series[mapping.env_state.topic].values
        env_state = np.stack([truth[sampled["env_state"].index[k]] for k in frames])
    last = status[b - 1] if status else {}
    instruction = mapping.task or str(last.get("instruction") or "")
    success = np.zeros(len(frames), dtype=bool)
    success[-1] = bool(last.get("success"))
    done = np.zeros(len(frames), dtype=bool)
    done[-1] = True
    return EpisodeBuffer(
        seed=number,
        instruction=instruction,
        images=images,
        state=state[: len(frames)],
        action=action,
        reward=success.astype(np.float32),
        done=done,
        success=success,
        env_state=None if env_state is None else env_state.astype(np.float32),
        extras=extras,
    )


def _write(
    out: Path,
    episodes: list[EpisodeBuffer],
    mapping: RosbagMapping,
    spec: RobotSpec,
    report: ImportReport,
) -> None:
    staging = out / STAGING_DIR
    if staging.exists():  # an interrupted import's: this one starts over
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    shards = []
    for start in range(0, len(episodes), EPISODES_PER_SHARD):
        end = min(start + EPISODES_PER_SHARD, len(episodes))
        write_shard(
            staging, start, end, episodes[start:end], True, spec.control_hz, mapping.video_crf
        )
        shards.append(staging / shard_name(start, end))
    schema = DatasetSchema(
        robot=spec.name,
        fps=spec.control_hz,
        state_names=spec.state_names,
        action_names=spec.action.names,
        cameras=tuple(mapping.cameras),
        image_size=mapping.image_size,
        crf=mapping.video_crf,
        env_state_names=tuple(mapping.env_state_names) if mapping.env_state else (),
        extras={name: _names(name, values) for name, values in episodes[0].extras.items()},
    )
    provenance = {
        "source": "rosbag",
        "mapping": mapping.model_dump(),
        "import": asdict(report),
        "code_version": code_version(),
    }
    finalize(out, shards, schema, provenance)


def _names(name: str, values: np.ndarray) -> tuple[str, ...]:
    """An extra's value names: ``imu[0]`` ... (its fields' numbers, in the mapping's order)."""
    return tuple(f"{name}[{k}]" for k in range(values.shape[1]))


def _dropped_text(report: ImportReport) -> str:
    if not report.dropped:
        return f"{report.frames} frames"
    return f"{report.frames} frames; dropped: " + ", ".join(
        f"{n} {why}" for why, n in report.dropped.items()
    )
