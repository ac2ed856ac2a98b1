"""The pipeline's records round-trip through JSON with their types (resume files, --json and
result.json hold these shapes), and a stored record that no longer fits is dropped, not used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.records import ChampionCheck, Evaluation, PipelineResult, Registration, StageRun
from pipelines.run.resume import StageRecords, stage_key
from stages.evaluate.comparison import Comparison, compare_outcomes
from stages.evaluate.sequential import plan_looks
from stages.register import Gate
from tests.stages.test_evaluate import suite_report

GATES = {
    "held-out success": Gate(True, True, "99.5% (95% CI 97.2% - 99.9%)", ">= 70%"),
    "latency": Gate(False, False, "p99 120.00 ms, 3 misses on local-cpu", "p99 <= 100 ms"),
}


def roundtrip(record: object) -> object:
    kind = type(record)
    return kind.from_json(json.loads(json.dumps(record.to_json())))  # type: ignore[attr-defined]


def test_pipeline_records_round_trip_with_their_types() -> None:
    candidate = suite_report(180)
    plan = plan_looks(1, 1, 0.05, 0.2, 0.05, 0.0, "pocock")
    candidate.comparison = compare_outcomes({}, {}, plan, 0, ("not worse", "", 0.05), "champion")
    evaluation = Evaluation(candidate=candidate, champion_version="3", start=suite_report(90))
    back = roundtrip(evaluation)
    assert back == evaluation and isinstance(back, Evaluation)
    assert isinstance(back.candidate.comparison, Comparison) and back.candidate.ci95 == (0.0, 1.0)
    registration = Registration("demo-policy", "4", ["candidate"], False, ["latency"], GATES, "s3")
    assert roundtrip(registration) == registration
    result = PipelineResult(
        config_name="demo",
        config_hash="abc",
        run_dir="/runs/1",
        model_name="demo-policy",
        version="4",
        aliases=["candidate"],
        promoted=False,
        blocked_by=[],
        gates=GATES,
        dataset="/d",
        checkpoint="/c",
        export="/e",
        success_rate=0.995,
        ci95=(0.972, 0.999),
        start_success_rate=None,
        latency_p99_ms=2.8,
        mlflow_run_id="r",
        stages={"collect": StageRun(12.5, True)},
        links={"MLflow run": "http://127.0.0.1:5000/#/x"},
    )
    assert roundtrip(result) == result
    check = ChampionCheck("demo-policy", "4", suite_report(150), 0.7, True)
    assert roundtrip(check) == check


def test_a_stored_record_that_no_longer_fits_is_dropped(tmp_path: Path) -> None:
    records = StageRecords(tmp_path)
    registration = Registration("m", "1", ["champion"], True, [], GATES, "src")
    records.put("register", "k", registration)
    assert records.get("register", "k", Registration, lambda r: True) == registration
    stale = {**registration.to_json(), "gates": {"latency": {"passed": "yes"}}}
    records.path("register", "k").write_text(json.dumps(stale))
    assert records.get("register", "k", Registration, lambda r: True) is None
    assert not records.path("register", "k").exists(), "the stage runs again"


def test_a_stored_record_names_the_home_as_a_mark_and_reads_back_where_the_home_is(
    robo_pipe_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage record names a path inside the home as ``$ROBO_PIPE_HOME/...``: read in the home's
    new place, it points there; a path outside the home, and a folder whose name only starts
    like the home's, stay as they were. The stage's key does not depend on where the home is."""
    source = f"file://{robo_pipe_home}/mlflow/artifacts/demo/r/artifacts/policy"
    elsewhere = [f"{robo_pipe_home}-old/x", "/data/outside"]
    registration = Registration("m", "1", [], False, elsewhere, GATES, source)
    records = StageRecords(robo_pipe_home / "stages")
    records.put("register", "k", registration)
    stored = records.path("register", "k").read_text()
    assert str(robo_pipe_home) + "/" not in stored and "$ROBO_PIPE_HOME/mlflow/" in stored
    key = stage_key("export", {"dataset": f"{robo_pipe_home}/datasets/d"})

    moved = tmp_path / "moved"
    (robo_pipe_home / "stages").rename(moved)
    monkeypatch.setenv("ROBO_PIPE_HOME", str(tmp_path))
    again = StageRecords(moved).get("register", "k", Registration, lambda r: True)
    assert again is not None and again.source == source.replace(str(robo_pipe_home), str(tmp_path))
    assert again.blocked_by == elsewhere
    assert stage_key("export", {"dataset": f"{tmp_path}/datasets/d"}) == key
