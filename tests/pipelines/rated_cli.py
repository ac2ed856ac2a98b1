"""The robo-pipe CLI with one more robot registered, ``rp5-25hz`` (rp5 controlled at 25 Hz, a
40 ms tick), and a task family that runs on it, ``touch25`` (the touch tasks): a robot whose
rate is not rp5's 10 Hz, for tests of the rate a policy is gated at (``python -m
tests.pipelines.rated_cli gate ...``). In a module of its own so the CLI imports no test code
beside it."""

from __future__ import annotations

from dataclasses import replace

from robots.rp5 import RP5
from sim_scenes.touch_task import TouchTasks

RATED_ROBOT = "rp5-25hz"
"""The registered name (a config's ``robot:``)."""
RATED_HZ = 25.0
"""Its control rate: 4 physics steps of rp5's 10 ms per tick."""

RP5_25HZ = replace(RP5, name=RATED_ROBOT, control_hz=RATED_HZ)


class RatedTouchTasks(TouchTasks):
    """The touch tasks on the 25 Hz robot (a task names the robot it runs on)."""

    name = "touch25"
    robot = RATED_ROBOT


RATED_TASKS = RatedTouchTasks()
RATED_TASK = "touch25/touch-mixed"
"""A config's ``scene.variant`` for the touch task on the 25 Hz robot."""


if __name__ == "__main__":
    from pipelines.cli import main
    from robots import spec
    from sim_scenes import tasks

    spec._REGISTRY[RATED_ROBOT] = "tests.pipelines.rated_cli:RP5_25HZ"
    tasks.TASKS[RatedTouchTasks.name] = "tests.pipelines.rated_cli:RATED_TASKS"
    main()
