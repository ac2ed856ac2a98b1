"""Many runs, one home: wall time of four tiny pipelines started together on a fresh home
against the same four one after another on another fresh home, on this machine's cores.

The four configs differ in their fine-tuning steps and share everything before it (dataset,
base model), as teammates' variants of one task do: run together, the first run of each shared
stage produces it and the others wait for it (and say so); run one after another, the later
runs reuse it from the stage records. Both start from an empty home, so both pay for creating
the MLflow and Prefect stores once. Every run goes through ``robo-pipe run`` in its own process,
as users start them.

Run: ``python benchmarks/shared_home.py [--quick]``; the last line is ``key=value`` pairs
(``speedup`` = one after another / together).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVERY_RUN = ["deploy.local_agent=false", "registry.promotion.min_success=0.0"]
"""Every run: no edge agent, and no success bar (these models rarely pass one); the runs
differ only in their fine-tuning steps."""
QUICK: tuple[str, list[str]] = ("configs/tiny.yaml", [])
"""The tiny profile the test suite uses (``--quick``)."""
SMALL = (
    "configs/demo.yaml",
    [
        "collect.workers=0",
        "collect.episodes=24",
        "pretrain.bc.workers=0",
        "finetune.bc.workers=0",
        "evaluate.episodes=10",
        "evaluate.workers=0",
        "latency.steps=100",
        "latency.pace=false",
    ],
)
"""The demo's model and image size with fewer episodes and steps (the full benchmark)."""


def command(config: str, sizes: list[str], steps: int) -> list[str]:
    """``robo-pipe run --config CONFIG`` with ``sizes`` and ``steps`` fine-tuning steps."""
    sets = [*EVERY_RUN, *sizes, f"finetune.bc.steps={steps}"]
    args = [arg for s in sets for arg in ("--set", s)]
    return [sys.executable, "-m", "pipelines.cli", "run", "--config", config, *args]


FINISHED = (0, 1)
"""A run's exit code when it ran to the end: its candidate promoted (0) or blocked by a gate
(1: a version with more steps need not beat the one before it)."""


def run_all(commands: list[list[str]], home: Path, together: bool) -> tuple[float, list[str]]:
    """Wall time of the runs, and what each printed (stderr) for the waiting lines."""
    env = {**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"}
    start = time.perf_counter()
    outputs = []
    if together:
        procs = [
            subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
            for cmd in commands
        ]
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode not in FINISHED:
                sys.exit(f"a run failed:\n{err[-2000:]}")
            outputs.append(err)
    else:
        for cmd in commands:
            done = subprocess.run(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
            if done.returncode not in FINISHED:
                sys.exit(f"a run failed:\n{done.stderr[-2000:]}")
            outputs.append(done.stderr)
    return time.perf_counter() - start, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny profile (configs/tiny.yaml)")
    args = parser.parse_args()
    (config, sizes), base = (QUICK, 10) if args.quick else (SMALL, 100)
    commands = [command(config, sizes, base + 2 * i) for i in range(4)]
    with tempfile.TemporaryDirectory(prefix="robo-pipe-shared-") as tmp:
        sequential, _ = run_all(commands, Path(tmp) / "one-after-another", together=False)
        print(f"4 runs one after another: {sequential:.1f} s", flush=True)
        concurrent, outputs = run_all(commands, Path(tmp) / "together", together=True)
        waits = sum(err.count("waiting for run") for err in outputs)
        print(f"4 runs together: {concurrent:.1f} s ({waits} waits for another run's stage)")
    print(
        f"runs=4 cores={os.cpu_count()} sequential_s={sequential:.1f} "
        f"concurrent_s={concurrent:.1f} speedup={sequential / concurrent:.2f} waits={waits}"
    )


if __name__ == "__main__":
    main()
