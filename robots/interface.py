"""The robot interface: what a real arm's driver implements so robo-pipe can run a policy on it.

The simulator backends in ``sim_scenes`` stand in for a robot through the same action and
observation conventions (see :class:`robots.spec.RobotSpec`), so a driver written against this
interface receives exactly the actions a policy was trained and gated on.
"""

from __future__ import annotations

import abc
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from robo_pipe.errors import InputError
from robots.spec import RobotSpec


@dataclass(frozen=True)
class RobotObservation:
    """One observation of a single robot.

    Attributes:
        images: camera name -> uint8 image, shape ``(height, width, 3)``, RGB.
        state: proprioception, float32, shape ``(spec.state_dim,)``: joint positions in rad
            followed by the gripper opening in m (see ``RobotSpec.state_names``).
        timestamp: seconds since ``connect()``, on the robot's clock.
        fault: why this observation must not be acted on, e.g. ``"stale: /joint_states 0.31 s
            old > max_age_s 0.25"`` (a driver's safety rule); "" when it may. The control loops
            send the hold action and count the tick as a miss.
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    timestamp: float
    fault: str = ""


class Robot(abc.ABC):
    """A physical (or emulated) arm driven at its control rate.

    Lifecycle: ``connect()`` once, then alternate ``observe()`` and ``act()`` once per control
    period (``1 / spec.control_hz`` seconds), then ``stop()``. ``stop()`` must leave the arm
    holding its current position and be safe to call more than once.
    """

    spec: RobotSpec

    @abc.abstractmethod
    def connect(self) -> None:
        """Open the connection to the hardware and check that it matches ``spec``."""

    @abc.abstractmethod
    def observe(self) -> RobotObservation:
        """Return the latest camera images and proprioceptive state."""

    @abc.abstractmethod
    def act(self, action: np.ndarray) -> None:
        """Send one action, shape ``(spec.action.dim,)``, in the units of ``spec.action``.

        Drivers clip to ``spec.action.low/high`` before sending; they never extrapolate.
        """

    @abc.abstractmethod
    def stop(self) -> None:
        """Hold the current position and release the hardware."""

    @property
    @abc.abstractmethod
    def is_connected(self) -> bool:
        """Whether ``connect()`` succeeded and ``stop()`` has not been called since."""


DriverFactory = Callable[[tuple[str, ...], int], Robot]
"""What a device's ``driver`` names: ``factory(cameras, image_size) -> Robot`` (the cameras and
the square image size the deployed policy takes)."""


class DriverError(InputError):
    """A driver's import path names nothing callable (the message names the path)."""


def load_driver(import_path: str) -> DriverFactory:
    """The driver factory named ``module:callable``, imported only now (so that nothing imports
    a simulator or a robot's SDK statically); :class:`DriverError` if it cannot be imported."""
    module_name, sep, attr = import_path.partition(":")
    if not (sep and module_name and attr):
        raise DriverError(f"{import_path!r}: expected an import path module:callable")
    try:
        factory = pkgutil.resolve_name(import_path)
    except ImportError as err:
        raise DriverError(f"{import_path!r}: cannot import: {err}") from err
    except AttributeError:
        factory = None
    if not callable(factory):
        raise DriverError(f"{import_path!r}: {module_name} has no callable {attr!r}")
    return cast(DriverFactory, factory)
