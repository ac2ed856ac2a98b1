"""Writing rosbag2 files (MCAP, zstd per message by default) with ``rosbags``: no ROS install.

What the twin records (``robo-pipe twin --record``), and what tests and the import benchmark
make their bags with. Messages are serialized by rosbags' own CDR (ROS 2 Kilted's message
definitions), which ``ros2 bag play`` and rosbags' reader both take.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np

IMAGE = "sensor_msgs/msg/Image"
JOINT_STATE = "sensor_msgs/msg/JointState"
COMMAND = "std_msgs/msg/Float64MultiArray"
STRING = "std_msgs/msg/String"
IMU = "sensor_msgs/msg/Imu"
POINT = "geometry_msgs/msg/PointStamped"


class BagWriter:
    """A new bag at ``path`` (which must not exist); ``storage``: ``mcap`` or ``sqlite3``;
    ``zstd``: compress each message. Times are int64 ns; each message's ``header.stamp`` is its
    time, and so is its log time."""

    def __init__(self, path: Path, storage: str = "mcap", zstd: bool = True) -> None:
        from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer
        from rosbags.typesys import Stores, get_typestore

        self.store = get_typestore(Stores.ROS2_KILTED)
        plugin = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}[storage]
        self._writer = Writer(path, version=9, storage_plugin=plugin)
        if zstd:
            self._writer.set_compression(CompressionMode.MESSAGE, CompressionFormat.ZSTD)
        self._writer.open()
        self._connections: dict[str, Any] = {}
        self.bytes = 0
        """Serialized message bytes written (before compression)."""

    def _write(self, topic: str, msgtype: str, ns: int, message: Any) -> None:
        if topic not in self._connections:
            self._connections[topic] = self._writer.add_connection(
                topic, msgtype, typestore=self.store
            )
        data = self.store.serialize_cdr(message, msgtype)
        self.bytes += len(data)
        self._writer.write(self._connections[topic], int(ns), data)

    def _header(self, ns: int, frame_id: str = "") -> Any:
        t = self.store.types
        sec, nanosec = divmod(int(ns), 1_000_000_000)
        stamp = t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec)
        return t["std_msgs/msg/Header"](stamp=stamp, frame_id=frame_id)

    def joint_state(self, topic: str, ns: int, names: list[str], positions: np.ndarray) -> None:
        """``sensor_msgs/JointState``: positions by name (no velocities or efforts)."""
        empty = np.zeros(0, dtype=np.float64)
        message = self.store.types[JOINT_STATE](
            header=self._header(ns),
            name=list(names),
            position=np.asarray(positions, dtype=np.float64),
            velocity=empty,
            effort=empty,
        )
        self._write(topic, JOINT_STATE, ns, message)

    def image(self, topic: str, ns: int, rgb: np.ndarray, frame_id: str = "") -> None:
        """``sensor_msgs/Image``, ``rgb8``, from uint8 ``(H, W, 3)``."""
        h, w, _ = rgb.shape
        message = self.store.types[IMAGE](
            header=self._header(ns, frame_id),
            height=h,
            width=w,
            encoding="rgb8",
            is_bigendian=0,
            step=w * 3,
            data=np.ascontiguousarray(rgb, dtype=np.uint8).reshape(-1),
        )
        self._write(topic, IMAGE, ns, message)

    def command(self, topic: str, ns: int, targets: np.ndarray) -> None:
        """``std_msgs/Float64MultiArray`` of position targets."""
        t = self.store.types
        layout = t["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
        message = t[COMMAND](layout=layout, data=np.asarray(targets, dtype=np.float64))
        self._write(topic, COMMAND, ns, message)

    def string(self, topic: str, ns: int, text: str) -> None:
        """``std_msgs/String``."""
        self._write(topic, STRING, ns, self.store.types[STRING](data=text))

    def imu(self, topic: str, ns: int, linear: np.ndarray, angular: np.ndarray) -> None:
        """``sensor_msgs/Imu``: linear acceleration (m/s^2) and angular velocity (rad/s)."""
        t = self.store.types
        vector = t["geometry_msgs/msg/Vector3"]
        message = t[IMU](
            header=self._header(ns, "imu"),
            orientation=t["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0),
            orientation_covariance=np.zeros(9),
            angular_velocity=vector(x=float(angular[0]), y=float(angular[1]), z=float(angular[2])),
            angular_velocity_covariance=np.zeros(9),
            linear_acceleration=vector(x=float(linear[0]), y=float(linear[1]), z=float(linear[2])),
            linear_acceleration_covariance=np.zeros(9),
        )
        self._write(topic, IMU, ns, message)

    def point(self, topic: str, ns: int, xyz: np.ndarray, frame_id: str = "world") -> None:
        """``geometry_msgs/PointStamped``: a position in m (a tracked object's)."""
        t = self.store.types
        point = t["geometry_msgs/msg/Point"](x=float(xyz[0]), y=float(xyz[1]), z=float(xyz[2]))
        self._write(topic, POINT, ns, t[POINT](header=self._header(ns, frame_id), point=point))

    def close(self) -> None:
        """Finish the bag (its index and metadata.yaml)."""
        self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
