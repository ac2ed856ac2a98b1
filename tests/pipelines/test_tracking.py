"""TrackedRun's logging, through the embedded SQLite MLflow store under the test's home: what does
not fit in one MLflow request still arrives whole (MlflowClient.log_batch splits it)."""

from __future__ import annotations

from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from pipelines import tracking
from pipelines.services import configure


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
