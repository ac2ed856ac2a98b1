"""Fixtures of the pipeline tests that run flows: a Prefect test server per module, and MLflow
pointed at the test's home in this process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[None]:
    """A real Prefect server for the whole module (started once: it takes seconds)."""
    from prefect.testing.utilities import prefect_test_harness

    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def services_here(robo_pipe_home: Path) -> None:
    """MLflow and Prefect in this process read the test's home, as the CLI and the flow do."""
    from pipelines.services.settings import configure

    configure()
