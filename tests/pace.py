"""Time bounds that hold on a busy machine: the product's own bound plus the machine's present
pace, measured in the same test.

A test that bounds how long the product takes (a stop, a refusal, a restart) asserts a figure
the product promises (``STOP_BOUND_S``, "before any work starts") plus what the machine needs,
now, for the work around it: starting and ending Python processes, which is most of what load
slows down. :func:`cli_start_s` measures that work (``robo-pipe --version`` in a subprocess, the
same interpreter and imports as the verb under test) at the moment of the test, so a bound is
``product_s + n * cli_start_s()``: about the product's figure on a quiet machine (one start takes
~1 s on 2 quiet cores), and proportionally more on cores a second heavy job shares. A bound
written as a bare number of seconds fails under load while the product is fine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli_start_s(samples: int = 3) -> float:
    """The median wall time, in seconds, of ``robo-pipe --version`` (a CLI process started,
    its imports loaded, ended) over ``samples`` runs, measured now."""
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "--version"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=300,
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bound_s(product_s: float, starts: float, pace_s: float | None = None) -> float:
    """A bound on a wall-clock figure: the product's own ``product_s`` plus ``starts`` CLI
    start-ups at the machine's present pace (``pace_s``, else :func:`cli_start_s` measured now)."""
    return product_s + starts * (cli_start_s() if pace_s is None else pace_s)
