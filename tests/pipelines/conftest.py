"""Fixtures of the pipeline tests that run flows: a Prefect test server per module, and MLflow
pointed at the test's home in this process."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def prefect_server() -> Iterator[None]:
    """A real Prefect server for the whole module (started once: it takes seconds), on a copy
    of the machine's migrated empty database (as a home's first run uses) instead of
    migrating a new one (~14 s a module on 2 cores)."""
    from prefect.testing import utilities

    from pipelines.stores import prefect_template

    def temporary_dir_with_the_template() -> str:
        folder = tempfile.mkdtemp()
        shutil.copyfile(prefect_template(), Path(folder) / "prefect-test.db")
        return folder

    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    with pytest.MonkeyPatch.context() as patch:
        # The harness's own temporary folder for its database (prefect 3.8's name for it).
        patch.setattr(utilities, "mkdtemp", temporary_dir_with_the_template)
        with utilities.prefect_test_harness(server_startup_timeout=180):
            yield


@pytest.fixture
def services_here(robo_pipe_home: Path) -> None:
    """MLflow and Prefect in this process read the test's home, as the CLI and the flow do."""
    from pipelines.services.settings import configure

    configure()
