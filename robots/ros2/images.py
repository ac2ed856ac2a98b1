"""Camera images as ROS carries them (``sensor_msgs/Image``) -> the uint8 RGB arrays a policy
takes. No ROS import: the driver reads rclpy's messages with it and the bag importer rosbags'
(both have the fields ``height``, ``width``, ``encoding``, ``step`` and ``data``)."""

from __future__ import annotations

from typing import Any

import numpy as np

ENCODINGS = {"rgb8": (3, False), "bgr8": (3, True), "rgba8": (4, False), "bgra8": (4, True)}
"""Image encodings the driver reads: channels, and whether they come blue first."""


def image_array(message: Any, size: int) -> np.ndarray:
    """``sensor_msgs/Image`` -> uint8 RGB ``(size, size, 3)``: the centre square, resized
    (bilinear) when the camera's is another size. ValueError on an encoding it cannot read."""
    if message.encoding not in ENCODINGS:
        raise ValueError(
            f"image encoding {message.encoding!r}: expected one of {', '.join(ENCODINGS)}"
        )
    channels, bgr = ENCODINGS[message.encoding]
    h, w = message.height, message.width
    try:  # rosbags: a numpy array; rclpy: an array.array or bytes (no copy either way)
        flat = np.frombuffer(message.data, dtype=np.uint8)
    except TypeError:  # a list of ints
        flat = np.asarray(message.data, dtype=np.uint8)
    rows = flat[: h * message.step].reshape(h, message.step)
    image = rows[:, : w * channels].reshape(h, w, channels)[:, :, :3]
    if bgr:
        image = image[:, :, ::-1]
    if (h, w) != (size, size):
        from PIL import Image as PILImage

        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        square = np.ascontiguousarray(image[top : top + side, left : left + side])
        image = np.asarray(
            PILImage.fromarray(square).resize((size, size), PILImage.Resampling.BILINEAR)
        )
    return np.ascontiguousarray(image)
