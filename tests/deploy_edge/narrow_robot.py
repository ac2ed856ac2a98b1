"""A device driver for agent processes in tests (``driver:`` in a device config), in a module
of its own so the agent imports no test code beside it."""

from __future__ import annotations

from dataclasses import replace

from sim_scenes.sim_robot import SimulatedRobot, simulated_rp5

NARROW = "tests.deploy_edge.narrow_robot:narrow_wrist_rp5"
"""The device config's ``driver`` for :func:`narrow_wrist_rp5`."""


def narrow_wrist_rp5(cameras: tuple[str, ...], image_size: int) -> SimulatedRobot:
    """The agent's default driver, its robot's wrist_pitch limited to -0.1..0.1 rad (0.2 rad of
    travel): a robot whose joint travels less than the tiny export's deltas for it (about
    -0.78 rad)."""
    robot = simulated_rp5(cameras, image_size)
    spec = robot.spec
    arm = tuple(replace(j, low=-0.1, high=0.1) if j.name == "wrist_pitch" else j for j in spec.arm)
    # What action_fault checks: the travel of what each action component moves.
    travel = (*(j.high - j.low for j in arm), *spec.action.travel[len(arm) :])
    robot.spec = replace(spec, arm=arm, action=replace(spec.action, travel=travel))
    return robot


RATED = "tests.deploy_edge.narrow_robot:rp5_at_25hz"
"""The device config's ``driver`` for :func:`rp5_at_25hz`."""


def rp5_at_25hz(cameras: tuple[str, ...], image_size: int) -> SimulatedRobot:
    """The agent's default driver, its rp5 controlled at 25 Hz instead of 10 Hz: a device
    whose robot is the bundle's but runs at another rate."""
    from robots.rp5 import RP5
    from robots.spec import load_robot
    from sim_scenes.touch import get_variant

    rated = load_robot(replace(RP5, control_hz=25.0))
    return SimulatedRobot(rated, get_variant("touch-mixed"), 0, tuple(cameras), image_size)
