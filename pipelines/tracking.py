"""MLflow runs: one run per pipeline run and a nested run per stage (the model registry is
:mod:`pipelines.registry`).

Runs are addressed by id through one :class:`mlflow.MlflowClient` (no "active run" state), so
stages running in Prefect's worker threads log to the right run. The store is
``MLFLOW_TRACKING_URI`` (see :mod:`pipelines.services.settings`; the embedded default is SQLite).

Experiments are tagged as model training (:data:`EXPERIMENT_KIND`), not GenAI: MLflow 3's UI
then shows an experiment's training runs and asks nothing; each run carries a description
(:meth:`TrackedRun.describe`), which MLflow shows on its page.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.home import default_artifact_root, default_tracking_uri
from pipelines.services.signals import interrupts_deferred
from pipelines.stores import ensure_mlflow_store

if TYPE_CHECKING:
    from mlflow import MlflowClient

TAG = "robo_pipe."

EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
"""The tag by which MLflow 3 tells a model-training experiment from a GenAI one (its UI asks
which an experiment without it is, and offers GenAI first)."""
DESCRIPTION_TAG = "mlflow.note.content"
"""The run tag MLflow shows as a run's description (markdown)."""

MLFLOW_CLASSIC_VIEW = "workflowType=machine_learning"
"""The query that opens an MLflow 3 UI page in its model-training view (the view its sidebar
switch picks, which a fresh browser starts in GenAI mode; the experiment's kind tag does not
move the switch in MLflow 3.17: mlflow#24498)."""


def mlflow_page(mlflow_ui: str, route: str) -> str:
    """The MLflow UI page at ``route`` (``experiments/1/runs/<id>``) in the model-training view."""
    return f"{mlflow_ui.rstrip('/')}/#/{route}?{MLFLOW_CLASSIC_VIEW}"


def client() -> MlflowClient:
    """A client of the configured tracking store and registry (an embedded SQLite store is
    created, or finished migrating, first: once, under a lock; see :mod:`pipelines.stores`)."""
    from mlflow import MlflowClient

    ensure_mlflow_store()
    return MlflowClient()


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> ``{"a.b.c": "value"}`` (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if not isinstance(value, str) else value
    return flat


# -- runs ----------------------------------------------------------------------------------------


def experiment_id(mlflow_client: MlflowClient, name: str) -> str:
    """The experiment ``name``, created if missing as a model-training experiment
    (:data:`EXPERIMENT_KIND`; one created before robo-pipe tagged them gets the tag, one whose
    kind someone chose keeps it), with its artifacts under the home on the default store, the
    server's default location otherwise."""
    import os

    # The lookup reads (and is a process's first touch of the store, which can take seconds
    # under load): only the writes below hold a stop back (see TrackedRun).
    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        for key, value in EXPERIMENT_KIND.items():
            if key not in found.tags:
                with interrupts_deferred():
                    mlflow_client.set_experiment_tag(found.experiment_id, key, value)
        return str(found.experiment_id)
    from mlflow.exceptions import MlflowException

    on_default_store = os.environ.get("MLFLOW_TRACKING_URI") == default_tracking_uri()
    location = f"{default_artifact_root()}/{name}" if on_default_store else None
    try:
        with interrupts_deferred():
            created = mlflow_client.create_experiment(
                name, artifact_location=location, tags=EXPERIMENT_KIND
            )
        return str(created)
    except MlflowException as err:
        # Another run of the same config created it a moment ago: use theirs.
        found = mlflow_client.get_experiment_by_name(name)
        if err.error_code != "RESOURCE_ALREADY_EXISTS" or found is None:
            raise
        return str(found.experiment_id)


@dataclass
class TrackedRun:
    """One MLflow run, addressed by id (a pipeline run or one of its stages).

    Every write to the store takes Ctrl-C and SIGTERM after it ends (``interrupts_deferred``).
    Why: a stop raised inside a write to the SQLite store left its transaction holding the
    database's lock, so the stage's own ``finish("FAILED")`` a moment later failed with
    "database is locked" and the run exited 3 instead of 143 (seen in CI, test_signals)."""

    run_id: str
    experiment_id: str

    @classmethod
    def start(
        cls,
        experiment: str,
        name: str,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> TrackedRun:
        """Create a run in ``experiment``; with ``parent_run_id`` it is nested under it."""
        mlflow_client = client()
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        exp = experiment_id(mlflow_client, experiment)  # its writes defer a stop themselves
        with interrupts_deferred():  # see TrackedRun: a stop never lands inside a write
            run = mlflow_client.create_run(exp, tags=all_tags, run_name=name)
        return cls(run.info.run_id, exp)

    def log_params(self, params: dict[str, Any]) -> None:
        """Log ``params`` flattened (``a.b.c``); MLflow cuts a value past its 6,000 characters."""
        from mlflow.entities import Param

        # log_batch sends as many requests as MLflow's per-request limits need.
        logged = [Param(k, v) for k, v in flatten(params).items()]
        with interrupts_deferred():
            client().log_batch(self.run_id, params=logged)

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Log scalar metrics at ``step``."""
        self.log_curves([{**metrics, "step": step}])

    def log_curves(self, records: list[dict[str, float]], step_key: str = "step") -> None:
        """Log a series: each record's numbers at the record's ``step_key`` value."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), now, int(record.get(step_key, 0)))
            for record in records
            for key, value in record.items()
            if key not in (step_key, "time") and isinstance(value, int | float)
        ]
        with interrupts_deferred():
            client().log_batch(self.run_id, metrics=metrics)

    def describe(self, text: str) -> None:
        """Set the run's description (markdown, shown on its MLflow page)."""
        self.set_tags({DESCRIPTION_TAG: text})

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Set run tags (values as strings)."""
        from mlflow.entities import RunTag

        with interrupts_deferred():
            client().log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a directory's contents, to the run's artifacts."""
        p = Path(path)
        with interrupts_deferred():
            if p.is_dir():
                client().log_artifacts(self.run_id, str(p), artifact_path)
            elif p.is_file():
                client().log_artifact(self.run_id, str(p), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED."""
        with interrupts_deferred():
            client().set_terminated(self.run_id, status)

    def artifact_uri(self, artifact_path: str = "") -> str:
        """Where an artifact of this run lives."""
        base = str(client().get_run(self.run_id).info.artifact_uri)
        return f"{base}/{artifact_path}" if artifact_path else base

    def ui_url(self, mlflow_ui: str) -> str:
        """This run's page in the MLflow UI at ``mlflow_ui`` (its model-training view)."""
        return mlflow_page(mlflow_ui, f"experiments/{self.experiment_id}/runs/{self.run_id}")
