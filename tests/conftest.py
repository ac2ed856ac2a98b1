"""Shared fixtures: a temporary $ROBO_PIPE_HOME for every test, tiny sizes, the default robot."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from robots.spec import RobotSpec, get_robot

# Local Ray stays on loopback (see stages/ray_runtime.py); set before anything imports Ray.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

NUM_ENVS = 4
"""Environments per batched env in unit tests."""


@pytest.fixture(autouse=True)
def robo_pipe_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test writes its state under its own temporary home."""
    home = tmp_path / "home"
    monkeypatch.setenv("ROBO_PIPE_HOME", str(home))
    yield home


@pytest.fixture(scope="session")
def rp5() -> RobotSpec:
    """The default robot, loaded once."""
    return get_robot("rp5")
