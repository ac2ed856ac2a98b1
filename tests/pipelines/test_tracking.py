"""TrackedRun's logging, through the embedded SQLite MLflow store under the test's home: what does
not fit in one MLflow request still arrives whole (MlflowClient.log_batch splits it)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from pipelines import tracking
from pipelines.services.settings import configure


def test_more_than_one_request_of_metrics_params_and_tags_all_arrive() -> None:
    configure()
    run = tracking.TrackedRun.start("tracking-test", "batches")

    steps = MAX_METRICS_PER_BATCH  # two metrics per record: twice what one request holds
    run.log_curves(
        [{"step": s, "loss": 1 / (s + 1), "reward": s, "time": 0.5} for s in range(steps)]
    )
    run.log_metrics({"final": 2.5}, step=7)
    many = MAX_PARAMS_TAGS_PER_BATCH + 1
    run.log_params(
        {
            **{f"p{i}": i for i in range(many)},
            "nested": {"list": [1, 2], "name": "x"},
            "long": "v" * (MAX_PARAM_VAL_LENGTH + 10),
        }
    )
    run.set_tags({f"t{i}": i for i in range(many)})
    run.finish()

    mlflow_client = tracking.client()
    loss = sorted(mlflow_client.get_metric_history(run.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in loss] == list(range(steps))
    assert [m.value for m in loss] == [1 / (s + 1) for s in range(steps)]
    assert len(mlflow_client.get_metric_history(run.run_id, "reward")) == steps
    data = mlflow_client.get_run(run.run_id).data
    assert "time" not in data.metrics, "a record's time is not a metric"
    assert data.metrics["final"] == 2.5
    assert [m.step for m in mlflow_client.get_metric_history(run.run_id, "final")] == [7]
    assert data.params == {
        **{f"p{i}": str(i) for i in range(many)},
        "nested.list": "[1, 2]",
        "nested.name": "x",
        "long": "v" * MAX_PARAM_VAL_LENGTH,  # MLflow cuts what is past its limit
    }
    assert {f"t{i}": str(i) for i in range(many)}.items() <= data.tags.items()


def test_experiments_are_model_training_ones_and_runs_carry_a_description() -> None:
    """MLflow 3 opens an experiment without a kind as GenAI (after asking): robo-pipe's are
    tagged model training, an older one of ours gets the tag, one whose kind someone chose
    keeps it; a run's description is the tag MLflow shows on its page."""
    configure()
    mlflow_client = tracking.client()
    run = tracking.TrackedRun.start("kind-test", "described")
    run.describe("robo-pipe pipeline run: **promoted v3**")
    assert mlflow_client.get_experiment(run.experiment_id).tags["mlflow.experimentKind"] == (
        "custom_model_development"
    )
    assert mlflow_client.get_run(run.run_id).data.tags["mlflow.note.content"] == (
        "robo-pipe pipeline run: **promoted v3**"
    )

    older = mlflow_client.create_experiment("made-before-the-tag")
    chosen = mlflow_client.create_experiment(
        "kind-chosen", tags={"mlflow.experimentKind": "genai_development"}
    )
    tracking.TrackedRun.start("made-before-the-tag", "r")
    tracking.TrackedRun.start("kind-chosen", "r")
    kind = "mlflow.experimentKind"
    assert mlflow_client.get_experiment(older).tags[kind] == "custom_model_development"
    assert mlflow_client.get_experiment(chosen).tags[kind] == "genai_development"


def test_a_stop_signal_during_a_write_takes_effect_after_it_and_the_run_can_still_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM arriving while a metric is written to the SQLite store is raised when the write
    has ended: the metric is stored, and the run's ``finish("FAILED")`` that a stopped stage
    calls next succeeds (a stop inside the write left the database locked: exit 3, not 143)."""
    configure()
    run = tracking.TrackedRun.start("tracking-test", "stopped")
    store = tracking.client()._tracking_client.store
    write = store.log_batch

    def signalled_midway(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at once, were it not deferred
        return write(*args, **kwargs)

    class Stopped(Exception):
        pass

    def stop(signum: int, frame: Any) -> None:
        raise Stopped

    monkeypatch.setattr(store, "log_batch", signalled_midway)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Stopped):
            run.log_metrics({"stage_seconds": 1.5})
    finally:
        signal.signal(signal.SIGTERM, previous)
    monkeypatch.undo()
    run.finish("FAILED")
    stored = tracking.client().get_run(run.run_id)
    assert stored.data.metrics == {"stage_seconds": 1.5}, "the write ended before the stop"
    assert stored.info.status == "FAILED"
