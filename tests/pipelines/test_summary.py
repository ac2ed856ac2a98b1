"""The run summary's rules on their own (the pipeline's summary, flow run and MLflow run are
checked after a real run in test_flow.py): links only to servers the user configured, paths
relative to the home, an outcome for every verdict, gate tables that render as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.records import DeviceRollout, EdgeDeployment, FleetResult, PipelineResult
from pipelines.run.places import RunPlaces, configured_links, home_relative
from pipelines.run.summary import VERDICT_STATES, outcome, run_title
from pipelines.run.tables import gates_table
from stages.register import Gate

HOME = Path("/data/robo-pipe-home")
PLACES = RunPlaces(
    home=HOME,
    flow_run_name="demo · promoted v3",
    flow_run_id="0b7f",
    experiment="demo",
    experiment_id="4",
    mlflow_run_id="a1c2",
    links={},
)


def test_links_go_only_to_servers_the_user_configured() -> None:
    # Nothing configured (the embedded store; a `robo-pipe ui` on whatever ports): no links.
    assert configured_links(PLACES, "demo-policy", "3", env={}) == {}
    sqlite = {"MLFLOW_TRACKING_URI": f"sqlite:///{HOME}/mlflow/mlflow.db"}
    assert configured_links(PLACES, "demo-policy", "3", env=sqlite) == {}
    # PREFECT_API_URL of the server a `robo-pipe ui` or `serve` started (it sets it): no link.
    local = "http://127.0.0.1:4200/api"
    api = {"PREFECT_API_URL": local}
    assert configured_links(PLACES, "demo-policy", "3", env=api, local_prefect_api=local) == {}
    # A Prefect server the user runs and configured: its UI is the API's server without /api.
    assert configured_links(PLACES, "demo-policy", "3", env=api) == {
        "Prefect flow run": "http://127.0.0.1:4200/runs/flow-run/0b7f"
    }

    configured = {
        "PREFECT_UI_URL": "https://prefect.example.org/",
        "MLFLOW_TRACKING_URI": "https://mlflow.example.org",
    }
    assert configured_links(PLACES, "demo-policy", "3", env=configured) == {
        "Prefect flow run": "https://prefect.example.org/runs/flow-run/0b7f",
        "MLflow run": "https://mlflow.example.org/#/experiments/4/runs/a1c2"
        "?workflowType=machine_learning",
        "MLflow model version": "https://mlflow.example.org/#/models/demo-policy/versions/3"
        "?workflowType=machine_learning",
    }


def test_paths_are_relative_to_the_home() -> None:
    assert home_relative(HOME / "runs" / "demo-pipeline-1", HOME) == "runs/demo-pipeline-1"
    assert home_relative(str(HOME / "exports" / "x" / "model.onnx"), HOME) == "exports/x/model.onnx"
    assert home_relative("/opt/models/base", HOME) == "/opt/models/base", "outside: as it is"


def _result(**changes: object) -> PipelineResult:
    fields: dict[str, object] = {
        "config_name": "demo",
        "config_hash": "abc",
        "run_dir": str(HOME / "runs" / "r"),
        "model_name": "demo-policy",
        "version": "3",
        "aliases": ["candidate", "champion"],
        "promoted": True,
        "blocked_by": [],
        "gates": {},
        "dataset": "d",
        "checkpoint": "c",
        "export": "e",
        "success_rate": 0.8,
        "ci95": (0.7, 0.9),
        "start_success_rate": None,
        "latency_p99_ms": 1.0,
        "mlflow_run_id": "a1c2",
    }
    return PipelineResult(**{**fields, **changes})  # type: ignore[arg-type]


def _device(state: str) -> EdgeDeployment:
    return EdgeDeployment("local-agent", "3", state, "p99 over budget", 9.0, None, 0, None, "s")


@pytest.mark.parametrize(
    ("changes", "title", "state"),
    [
        ({}, "demo · promoted v3", "Promoted"),
        (
            {"promoted": False, "blocked_by": ["held-out success", "latency"]},
            "demo · v3 BLOCKED (held-out success, latency)",
            "Blocked",
        ),
        ({"device": _device("refused")}, "demo · v3 promoted, REFUSED on local-agent", "Refused"),
        (
            {"device": _device("rolled_back")},
            "demo · v3 promoted, ROLLED BACK on local-agent",
            "Refused",
        ),
        (
            {
                "rollout": FleetResult(
                    "demo-policy",
                    "3",
                    "fleet.yaml",
                    [["a"], ["b"]],
                    [DeviceRollout("a", 0, None, None, "refused")],
                    stopped_at_wave=0,
                )
            },
            "demo · v3 promoted, rollout STOPPED at wave 0",
            "Rollout stopped",
        ),
    ],
    ids=["promoted", "blocked", "refused", "rolled-back", "rollout-stopped"],
)
def test_every_verdict_has_a_title_and_a_state(
    changes: dict[str, object], title: str, state: str
) -> None:
    result = _result(**changes)
    assert run_title(result) == title and outcome(result) in title
    assert VERDICT_STATES[result.verdict] == state


def test_the_gates_table_renders_as_written() -> None:
    gates = {
        "held-out success": Gate(True, True, "lower end 71.0%", ">= 70% (lower end of the 95% CI)"),
        "no regression vs champion": Gate(False, False, "-3.0% vs v2", "not worse at 95%"),
        "latency": Gate(False, True, "p99 9.1 ms", "p99 <= 5 ms, misses <= 0"),
    }
    rows = gates_table(gates)
    assert [r["result"] for r in rows] == ["pass", "fail (not enforced)", "FAIL"]
    assert rows[0]["required"] == "≥ 70% (lower end of the 95% CI)"
    assert rows[2]["required"] == "p99 ≤ 5 ms, misses ≤ 0"
    assert not [v for r in rows for v in r.values() if v.startswith(">")]
