"""`make test` ends on pytest's summary: the Ray instance a test started is stopped before the
summary (tests/conftest.py), so what Ray's workers still report never prints after it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

KILLS_A_WORKER = '''
import os
import signal


def test_kills_a_ray_worker_and_returns_at_once():
    """As the worker-fault tests do: Ray reports the death a moment later."""
    from stages.ray_runtime import init_ray

    init_ray(num_cpus=1)
    import ray

    @ray.remote
    class Worker:
        def pid(self):
            return os.getpid()

    os.kill(ray.get(Worker.remote().pid.remote()), signal.SIGKILL)
'''


def test_the_summary_is_the_last_line_after_a_test_killed_a_ray_worker(tmp_path: Path) -> None:
    test = tmp_path / "test_ray_worker.py"
    test.write_text(KILLS_A_WORKER)
    result = subprocess.run(
        # tests/conftest.py as a plugin: the test file lives outside tests/
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:randomly",
            "-q",
            str(test),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.strip().splitlines()[-1].startswith("1 passed in"), result.stdout[-3000:]
    assert "SYSTEM_ERROR" not in result.stdout, result.stdout[-3000:]
