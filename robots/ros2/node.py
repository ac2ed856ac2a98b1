"""A ROS 2 node spinning on its own thread, and the messages robo-pipe exchanges with an arm.

The only module besides the driver and the twin that imports ``rclpy`` (an optional extra:
``pip install 'robo-pipe[ros]'``); importing it where rclpy is missing raises
:class:`Ros2Unavailable`, which names the fix.

QoS, chosen as ros2_control and camera drivers publish:
    sensors (joint states, images)  best effort, keep last 1: only the newest sample matters,
                                    and a best-effort reader matches a reliable writer too;
    commands, e-stop, episode       reliable, keep last 1: a command or a stop must not be
                                    dropped, and an old one is worth nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from robo_pipe.errors import InputError
from robots.ros2.images import image_array


class Ros2Unavailable(InputError):
    """rclpy (or its messages) is not installed in this environment."""


try:
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Bool, Float64MultiArray, String
except ImportError as err:  # pragma: no cover - exercised where rclpy is absent
    raise Ros2Unavailable(
        f"the ROS 2 robot needs rclpy and the std_msgs/sensor_msgs messages ({err}): install "
        "them with `pip install 'robo-pipe[ros]'` (x86_64 wheels), or source a ROS 2 "
        "install (Jazzy or newer) before starting robo-pipe"
    ) from err

__all__ = [
    "RELIABLE",
    "SENSORS",
    "Bool",
    "Float64MultiArray",
    "Image",
    "JointState",
    "Received",
    "Ros2Unavailable",
    "SpinningNode",
    "String",
    "image_array",
    "image_message",
    "read_json",
]

SENSORS = QoSProfile(
    history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT
)
RELIABLE = QoSProfile(
    history=HistoryPolicy.KEEP_LAST,
    depth=1,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# Discovery stays on this machine unless the user says otherwise: a test's twin and driver must
# not meet another machine's, and a lab sets ROS_AUTOMATIC_DISCOVERY_RANGE itself.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")


@dataclass
class Received:
    """The newest message of a topic and when it arrived (``time.monotonic()`` s: the
    receiver's clock, so an arm's clock that is off does not make a sample look fresh)."""

    message: Any
    at: float


class SpinningNode:
    """A node in a context of its own, its callbacks run by an executor on a daemon thread.

    Its own context: several robots in one process (the agent makes one per episode) start
    and stop independently. rclpy's signal handlers are not installed: robo-pipe's own
    handle SIGINT and SIGTERM (:mod:`pipelines.services.signals`)."""

    def __init__(self, name: str, domain_id: int | None = None) -> None:
        self.context = Context()
        rclpy.init(
            context=self.context,
            domain_id=domain_id,
            signal_handler_options=SignalHandlerOptions.NO,
        )
        self.node = Node(name, context=self.context, start_parameter_services=False)
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._latest: dict[str, Received] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._spin, name=f"ros2-{name}", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:  # the context shut down under the executor: the node is closing
            if self.context.ok():
                raise

    def keep_latest(self, msg_type: type, topic: str, qos: QoSProfile = SENSORS) -> None:
        """Subscribe ``topic``, keeping its newest message (:meth:`latest`)."""

        def store(message: Any) -> None:
            with self._lock:
                self._latest[topic] = Received(message, time.monotonic())

        self.node.create_subscription(msg_type, topic, store, qos)

    def on(self, msg_type: type, topic: str, callback: Callable[[Any], None]) -> None:
        """Subscribe ``topic`` (reliable) with ``callback`` run on the node's thread."""
        self.node.create_subscription(msg_type, topic, callback, RELIABLE)

    def latest(self, topic: str) -> Received | None:
        """The newest message of a :meth:`keep_latest` topic (None before the first)."""
        with self._lock:
            return self._latest.get(topic)

    def forget(self) -> None:
        """Drop every kept message (a new episode must not act on the last one's)."""
        with self._lock:
            self._latest.clear()

    def close(self) -> None:
        """Stop the executor, destroy the node, shut the context down (idempotent)."""
        if not self.context.ok():
            return
        self._executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._thread.join(timeout=2.0)


def image_message(image: np.ndarray, stamp: Any, frame_id: str) -> Image:
    """uint8 RGB ``(H, W, 3)`` -> ``sensor_msgs/Image`` (``rgb8``)."""
    h, w, _ = image.shape
    message = Image(height=h, width=w, encoding="rgb8", is_bigendian=0, step=w * 3)
    message.header.stamp, message.header.frame_id = stamp, frame_id
    message.data = np.ascontiguousarray(image, dtype=np.uint8).tobytes()
    return message


def read_json(message: String) -> dict[str, Any]:
    """A ``std_msgs/String`` carrying a JSON object ({} when it does not)."""
    try:
        data = json.loads(message.data)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
