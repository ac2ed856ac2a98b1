"""Reading a rosbag2 (MCAP or sqlite3, zstd or not) with ``rosbags``: no ROS install.

:func:`check_bag` looks at the bag's index and each mapped topic's first message (seconds);
:func:`read_series` decodes every mapped message once into time-sorted series. A bag that ends
in the middle of a chunk, or a message that does not decode, is a :class:`BagError`, raised
before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.errors import InputError
from robots.ros2.images import ENCODINGS, image_array
from robots.spec import RobotSpec
from stages.ingest.mapping import ExtraMap, RosbagMapping

IMAGE = "sensor_msgs/msg/Image"
JOINT_STATE = "sensor_msgs/msg/JointState"
COMMAND = "std_msgs/msg/Float64MultiArray"
STRING = "std_msgs/msg/String"
ROLE_TYPES = {"state": {JOINT_STATE}, "camera": {IMAGE}, "action": {COMMAND}, "episodes": {STRING}}
"""The message types each role of a topic is read as (extras: any message with the fields)."""


class BagError(InputError):
    """A bag that cannot be imported as mapped: not a bag, a topic missing or of another type,
    a joint or field its messages lack, images too small, or corrupt data (the message names
    the bag, the topic and what is wrong)."""


@dataclass
class Series:
    """Every message of one topic, decoded, in time order."""

    topic: str
    ns: np.ndarray
    """int64 message times, ns: ``header.stamp`` where the message has one, else the bag's
    log time; ascending."""
    values: list[Any] = field(default_factory=list)

    @property
    def rate_hz(self) -> float:
        """Messages per second (median period); 0 with fewer than two."""
        if len(self.ns) < 2:
            return 0.0
        return float(1e9 / np.median(np.diff(self.ns))) if np.any(np.diff(self.ns)) else 0.0

    @property
    def max_gap_s(self) -> float:
        """The longest time between two consecutive messages, s."""
        return float(np.max(np.diff(self.ns)) / 1e9) if len(self.ns) > 1 else 0.0


@contextmanager
def open_bag(path: Path) -> Iterator[Any]:
    """The bag's reader (``rosbags.rosbag2.Reader``, opened); :class:`BagError` if ``path`` is
    not a rosbag2 folder it can read."""
    from rosbags.rosbag2 import Reader, ReaderError

    if not path.is_dir():
        raise BagError(f"{path}: not a rosbag2 folder (a directory with metadata.yaml)")
    try:
        reader = Reader(path)
        reader.open()
    except (ReaderError, OSError, ValueError, KeyError) as err:
        raise BagError(f"{path}: cannot open the bag: {err}") from err
    try:
        yield reader
    finally:
        reader.close()


def typestore() -> Any:
    """The message definitions bags are read with (ROS 2 Kilted's; a bag's own definitions,
    stored in MCAP, are registered on top when it has types of its own)."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_KILTED)


def _connections(reader: Any, mapping: RosbagMapping, bag: Path) -> dict[str, Any]:
    """Each mapped topic's connection; :class:`BagError` naming the missing or mistyped."""
    found = {c.topic: c for c in reader.connections}
    missing = [
        f"{topic} ({role})" for topic, role in mapping.topics().items() if topic not in found
    ]
    if missing:
        raise BagError(
            f"{bag}: no topic {', '.join(missing)} in the bag; it has: {', '.join(sorted(found))}"
        )
    for topic, roles in mapping.topics().items():
        role = roles.removeprefix("reference, ")
        wanted = ROLE_TYPES.get(role.split()[0])
        if wanted and found[topic].msgtype not in wanted:
            raise BagError(
                f"{bag}: topic {topic} ({role}) is {found[topic].msgtype}, expected "
                f"{' or '.join(sorted(wanted))}"
            )
    return {topic: found[topic] for topic in mapping.topics()}


def check_bag(bag: Path, mapping: RosbagMapping, spec: RobotSpec) -> dict[str, int]:
    """Everything the import needs, from the index and each topic's first message: every
    mapped topic there with its type; the joint states name every mapped joint; each camera's
    images in an encoding read here and no smaller than ``image_size``; each extra's fields.
    Returns each topic's message count. :class:`BagError` otherwise, before any decoding."""
    store = typestore()
    with open_bag(bag) as reader:
        connections = _connections(reader, mapping, bag)
        counts = {topic: int(c.msgcount) for topic, c in connections.items()}
        if empty := [t for t, n in counts.items() if n == 0]:
            raise BagError(f"{bag}: topic {', '.join(empty)} has no messages")
        first = _first_messages(reader, connections, store, bag)
    joints = set(first[mapping.state.topic].name)
    if missing := [n for n in mapping.state.joints.values() if n not in joints]:
        raise BagError(
            f"{bag}: {mapping.state.topic} has no joint {', '.join(missing)} (the mapping's "
            f"state.joints); its joints: {', '.join(sorted(joints))}"
        )
    for camera, topic in mapping.cameras.items():
        image = first[topic]
        if image.encoding not in ENCODINGS:
            raise BagError(
                f"{bag}: {topic} (camera {camera}) is {image.encoding!r}; readable: "
                f"{', '.join(ENCODINGS)}"
            )
        if min(image.height, image.width) < mapping.image_size:
            raise BagError(
                f"{bag}: {topic} (camera {camera}) images are {image.width}x{image.height}, "
                f"smaller than the dataset's {mapping.image_size} px (image_size): an image is "
                "never enlarged"
            )
    for name, extra in _float_maps(mapping).items():
        for field_name in extra.fields:
            try:
                _floats(first[extra.topic], field_name)
            except (AttributeError, TypeError, ValueError) as err:
                raise BagError(
                    f"{bag}: {extra.topic} ({name}) has no numeric field {field_name!r}"
                ) from err
    return counts


def _float_maps(mapping: RosbagMapping) -> dict[str, ExtraMap]:
    """The float features the mapping reads from messages: its extras and its env_state."""
    maps = dict(mapping.extras)
    if mapping.env_state is not None:
        maps["env_state"] = mapping.env_state
    return maps


def _first_messages(
    reader: Any, connections: dict[str, Any], store: Any, bag: Path
) -> dict[str, Any]:
    first: dict[str, Any] = {}
    for topic, connection in connections.items():
        try:
            for conn, log_ns, raw in reader.messages(connections=[connection]):
                first[topic] = _decode(store, conn, raw, bag, log_ns)
                break
        except BagError:
            raise
        except Exception as err:  # as in read_series
            raise BagError(f"{bag}: corrupt or truncated bag: {type(err).__name__}: {err}") from err
    return first


def _decode(store: Any, connection: Any, raw: bytes, bag: Path, log_ns: int) -> Any:
    try:
        return store.deserialize_cdr(raw, connection.msgtype)
    except Exception as err:  # rosbags raises several kinds on bad bytes
        raise BagError(
            f"{bag}: corrupt message on {connection.topic} at {log_ns / 1e9:.3f} s: {err}"
        ) from err


def read_series(
    bag: Path,
    mapping: RosbagMapping,
    spec: RobotSpec,
    on_message: Callable[[int], None] | None = None,
) -> dict[str, Series]:
    """Every mapped topic decoded once, time-sorted: joint states as the robot's positions
    (float64, the mapping's joint order), images as uint8 RGB (``image_size``), commands as
    float64 arrays, episode statuses as dicts, extras as float32 vectors. ``on_message(n)``
    after every 1,000 messages. :class:`BagError` on a message that does not decode or a bag
    that ends mid-chunk."""
    store = typestore()
    order = [mapping.state.joints[j.name] for j in (*spec.arm, *spec.gripper)]
    cameras = {topic: camera for camera, topic in mapping.cameras.items()}
    extras = {extra.topic: extra.fields for extra in _float_maps(mapping).values()}
    series: dict[str, tuple[list[int], list[Any]]] = {t: ([], []) for t in mapping.topics()}
    with open_bag(bag) as reader:
        connections = _connections(reader, mapping, bag)
        n = 0
        try:
            for conn, log_ns, raw in reader.messages(connections=list(connections.values())):
                message = _decode(store, conn, raw, bag, log_ns)
                topic = conn.topic
                times, values = series[topic]
                times.append(_stamp(message, log_ns))
                if topic == mapping.state.topic:
                    by_name = dict(zip(message.name, message.position, strict=False))
                    values.append(np.array([by_name.get(n, np.nan) for n in order]))
                elif topic in cameras:
                    values.append(image_array(message, mapping.image_size))
                elif topic == mapping.action.topic:
                    values.append(np.asarray(message.data, dtype=np.float64))
                elif topic == mapping.episodes.topic:
                    values.append(_json(message.data))
                elif topic in extras:
                    values.append(np.concatenate([_floats(message, f) for f in extras[topic]]))
                else:  # the reference alone (not a camera): its times are what it gives
                    values.append(None)
                n += 1
                if on_message is not None and n % 1000 == 0:
                    on_message(n)
        except BagError:
            raise
        except Exception as err:  # rosbags, its MCAP reader and zstd each raise their own
            raise BagError(f"{bag}: corrupt or truncated bag: {type(err).__name__}: {err}") from err
    out = {}
    for topic, (times, values) in series.items():
        ns = np.asarray(times, dtype=np.int64)
        order_ = np.argsort(ns, kind="stable")  # stamps may come out of log order
        out[topic] = Series(topic, ns[order_], [values[k] for k in order_])
    return out


def _stamp(message: Any, log_ns: int) -> int:
    """``header.stamp`` in ns where the message has a non-zero one, else the log time."""
    header = getattr(message, "header", None)
    if header is not None:
        ns = int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)
        if ns > 0:
            return ns
    return int(log_ns)


def _floats(message: Any, dotted: str) -> np.ndarray:
    """The numbers of a message field: a vector's x, y, z (and w), a number, an array."""
    value = message
    for part in dotted.split("."):
        value = getattr(value, part)
    if hasattr(value, "x") and hasattr(value, "y"):
        parts = [value.x, value.y, value.z] + ([value.w] if hasattr(value, "w") else [])
        return np.asarray(parts, dtype=np.float32)
    array = np.atleast_1d(np.asarray(value, dtype=np.float32))
    if array.ndim != 1:
        raise ValueError(f"{dotted}: not a number or a flat array")
    return array


def _json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
