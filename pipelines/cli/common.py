"""What every verb shares: the console, loading a config, the services, a user error's
report."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from pipelines.config import PipelineConfig, load_config
from robo_pipe.errors import RoboPipeError, ServiceFailure

if TYPE_CHECKING:
    from pipelines.services.settings import Services

console = Console(stderr=True, soft_wrap=not os.isatty(2), width=None if os.isatty(2) else 1000)
"""Everything for people goes to stderr; stdout's last line is the ``--json`` record. In a log
(stderr is not a terminal) no line is wrapped and a table is as wide as its content: a path
stays whole, where rich would break it at 80 columns."""
out = Console(soft_wrap=not os.isatty(1), width=None if os.isatty(1) else 1000)
"""A verb's result for people (tables, lists, info, run's summary): stdout, so that it pipes
(``robo-pipe models list | grep``); wrapped as ``console`` is. Progress, status, warnings and
errors go to ``console``."""


def result_console(json_out: bool) -> Console:
    """Where a verb prints its result for people: stdout, or stderr with ``--json`` (stdout
    then carries the JSON record alone)."""
    return console if json_out else out


def load(config: Path, set_: list[str] | None, **options: object) -> PipelineConfig:
    """``config`` with ``--set`` overrides, then verb options (``{"a.b": value}``; None means
    not given). A shipped config may be named without its folder (``demo.yaml``)."""
    overrides = list(set_ or [])
    overrides += [f"{field}={value}" for field, value in options.items() if value is not None]
    return load_config(config, overrides)


def emit_json(record: Any, json_out: bool) -> None:
    """With ``--json``: the result record as one JSON line on stdout, the only thing there."""
    if json_out:
        print(json.dumps(record.to_json() if hasattr(record, "to_json") else record))


def services(flows: bool = False, ray_address: str | None = None) -> Services:
    """Configure Prefect/MLflow for this home and check the configured servers answer. With
    ``flows`` (a verb that runs Prefect flows) and no Prefect server configured, create the
    home's Prefect database first, under a lock (:mod:`pipelines.stores`), so that the
    temporary server each run starts never migrates it at the same time as another's. With
    ``ray_address``, join that Ray cluster and check its nodes share the home
    (:func:`pipelines.services.settings.join_cluster`)."""
    from pipelines.services.settings import (
        check_services,
        configure,
        join_cluster,
        refresh_prefect_settings,
    )
    from pipelines.stores import ensure_prefect_store

    found = configure()
    refresh_prefect_settings()  # loading the config may have imported Prefect already
    check_services(found)
    if flows and found.prefect_api_url is None:
        ensure_prefect_store()
    join_cluster(ray_address)
    return found


def read_registry() -> str | None:
    """Configure for reading the registry, creating nothing (not even the home): None when
    there is a registry to read, else why not (the embedded one does not exist yet)."""
    from pipelines.services.settings import check_services, configure
    from pipelines.stores import sqlite_path

    found = configure(create=False)
    store = sqlite_path(found.mlflow_tracking_uri)
    if store is not None and not store.is_file():
        return f"no registry yet: {store} does not exist (robo-pipe run registers the first model)"
    check_services(found)
    return None


def quiet_prefect_console() -> None:
    """Keep Prefect's own log (and a failed flow's traceback) off the terminal: our verbs say
    what happened; the log stays in the Prefect UI. Set before Prefect configures logging."""
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


def report_user_error(err: RoboPipeError) -> int:
    """Print a user error, one line per problem, and return its exit code: 2, or 3 for a
    :class:`~robo_pipe.errors.ServiceFailure` (nothing in the input is wrong)."""
    for line in str(err).splitlines():
        console.print(f"[red]error:[/red] {line}", highlight=False, markup=True)
    return 3 if isinstance(err, ServiceFailure) else 2
