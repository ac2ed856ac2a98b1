"""The robo-pipe CLI with one more robot registered, ``rp5-25hz`` (rp5 controlled at 25 Hz, a
40 ms tick): a robot whose rate is not rp5's 10 Hz, for tests of the rate a policy is gated at
(``python -m tests.pipelines.rated_cli gate ...``). In a module of its own so the CLI imports
no test code beside it."""

from __future__ import annotations

from dataclasses import replace

from robots.rp5 import RP5

RATED_ROBOT = "rp5-25hz"
"""The registered name (a config's ``robot:``)."""
RATED_HZ = 25.0
"""Its control rate: 4 physics steps of rp5's 10 ms per tick."""

RP5_25HZ = replace(RP5, name=RATED_ROBOT, control_hz=RATED_HZ)


if __name__ == "__main__":
    from pipelines.cli import main
    from robots import spec

    spec._REGISTRY[RATED_ROBOT] = "tests.pipelines.rated_cli:RP5_25HZ"
    main()
