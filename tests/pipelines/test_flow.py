"""The train_simulate_deploy flow on tiny sizes against a real Prefect test server and a real
SQLite MLflow registry: registration, gates, resume, the registry CLI, bad input."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import numpy as np
import pytest
import yaml

from pipelines.config import CONFIG_DIR, ConfigError
from pipelines.services.local_servers import free_port, preferred_ports
from stages.register import GATE_TAG, failed_gates
from tests.conftest import TINY_CONFIG, tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(TINY_CONFIG)
MODEL = "demo-policy"

TINY = [
    # A policy trained for 10 steps succeeds rarely: these tests are about the gates' plumbing.
    "registry.promotion.min_success=0.0",
]
"""What every run of these tests sets on the tiny profile (``CONFIG``)."""


@pytest.fixture
def home_path(shared_home: Path) -> Path:
    return shared_home


pytestmark = pytest.mark.usefixtures("prefect_server", "services_here")


def run_pipeline(*extra: str, home: Path | None = None, config: str = CONFIG) -> dict[str, Any]:
    """The flow in this process on ``config``; ``home``: point it (and in-process MLflow) at
    that home first, as module-scoped fixtures must (they start before the per-test home
    fixture)."""
    from pipelines.run.flow import train_simulate_deploy
    from pipelines.services.settings import configure

    if home is not None:
        os.environ["ROBO_PIPE_HOME"] = str(home)
        configure()

    return train_simulate_deploy(config=config, overrides=[*TINY, *extra]).to_json()


@pytest.fixture(scope="module")
def first_run(prefect_server: None, shared_home: Path) -> dict[str, Any]:
    return run_pipeline(home=shared_home)


@pytest.fixture(scope="module")
def gated_run(first_run: dict[str, Any], shared_home: Path) -> dict[str, Any]:
    """Another model (more steps) of the same name, held to a latency budget no machine meets:
    registered, not promoted (the models CLI test promotes it by force). Its latency stage
    plays the delay sweep too (``latency.sweep``)."""
    return run_pipeline(
        "finetune.bc.steps=12", "latency.budget_ms=0.0001", "latency.sweep=true", home=shared_home
    )


def robo_pipe(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pipeline_registers_a_gated_champion(first_run: dict[str, Any]) -> None:
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from pipelines.registry.promotion import champion_history
    from pipelines.registry.tags import (
        BASE_MODEL_TAG,
        CODE_VERSION_TAG,
        CONFIG_HASH_TAG,
        DATASET_HASH_TAG,
    )
    from pipelines.registry.versions import get_version

    assert first_run["promoted"] and first_run["version"] == "1"
    device = first_run["device"]  # the demo ends on a device: the local edge agent
    assert device["state"] == "active" and device["model_version"] == "1", device
    assert device["episode_ticks"] == 10 and device["p99_ms"] is not None
    active = Path(device["state_dir"]) / "active"
    assert active.exists() and (active.resolve().parent / "manifest.json").is_file()
    assert set(first_run["aliases"]) == {"candidate", "champion"}
    assert all(g["passed"] for g in first_run["gates"].values())
    assert champion_history(MODEL)[0] == "1", "the first version became champion"
    info = get_version(MODEL, "1")
    lineage = (DATASET_HASH_TAG, BASE_MODEL_TAG, CONFIG_HASH_TAG, CODE_VERSION_TAG)
    for key in (*lineage, GATE_TAG + "latency"):
        assert info.tags[key], key
    assert info.tags[GATE_TAG + "latency"] == "passed"

    # MLflow: one pipeline run with the resolved config as params, a nested run per stage.
    client = MlflowClient()
    parent = client.get_run(first_run["mlflow_run_id"])
    assert parent.data.params["collect.episodes"] == "8"
    assert parent.data.metrics["success_rate"] == pytest.approx(first_run["success_rate"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    stages = {r.data.tags["robo_pipe.stage"]: r for r in children}
    assert set(stages) == {
        "collect",
        "pretrain",
        "finetune",
        "export",
        "evaluate",
        "latency",
        "register",
        "deploy",  # a new champion goes onto the local edge agent
    }
    assert len(client.get_metric_history(stages["finetune"].info.run_id, "action_loss")) >= 2
    assert "latency_p99_ms" in stages["latency"].data.metrics
    export_metrics = stages["export"].data.metrics  # the INT8 variant, made and scored
    assert {"int8_relative_error", "export_seconds", "export_peak_rss_mb"} <= set(export_metrics)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.md", "plots", "policy", "config.yaml"} <= artifacts

    # Prefect: a task run per stage, and the summary, tables and link as artifacts.
    flow_run_id = first_run["links"]["Prefect flow run"].rsplit("/", 1)[1]
    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(flow_run_id)
        assert flow_run.state is not None and flow_run.state.is_completed()
        task_runs = prefect.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
        artifacts_of_run = prefect.read_artifacts()
    assert {t.name.rsplit("-", 1)[0] for t in task_runs} == set(stages)
    mine = [a for a in artifacts_of_run if a.flow_run_id == flow_run.id]
    keys = {a.key: a.type for a in mine}
    assert keys["demo-pipeline-summary"] == "markdown" and keys["demo-evaluation"] == "table"
    assert {"demo-latency", "demo-gates", "demo-mlflow-run"} <= set(keys)  # the link: markdown
    text = (Path(first_run["run_dir"]) / "summary.md").read_text()
    assert (
        "## Gates" in text
        and "95% CI" in text
        and "p99" in text
        and "models:/demo-policy/1" in text
    )
    # The tiny profile makes and scores INT8 but does not play its success (score_success off).
    assert "## Precision variants" in text and "| int8 |" in text and "not measured" in text


def test_registered_champion_runs_in_onnxruntime(first_run: dict[str, Any]) -> None:
    """A third party loads the champion with MLflow's own ONNX flavor and runs it."""
    import mlflow.onnx
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from pipelines.registry.exports import fetch_export
    from stages.dataset.layout import STATE_KEY
    from stages.dataset.reader import open_dataset

    model = mlflow.onnx.load_model(f"models:/{MODEL}@champion")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _, export_dir = fetch_export(MODEL, "champion")
    spec = json.loads((export_dir / "io_spec.json").read_text())
    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer" / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=spec["pad_id"], length=spec["max_tokens"])

    dataset = open_dataset(first_run["dataset"])
    frames = dataset.frames()
    encoding = tokenizer.encode(dataset.tasks[int(frames["task_index"][0])])
    feeds = {
        "image_scene": dataset.camera_frames("scene")[:1],
        "state": frames[STATE_KEY][:1].astype(np.float32),
        "tokens": np.array([encoding.ids], dtype=np.int64),
        "token_mask": np.array([encoding.attention_mask], dtype=np.int64),
    }
    actions, _ = session.run(["actions", "action_std"], feeds)
    assert actions.shape == (1, spec["chunk_len"], spec["action_dim"])
    assert np.isfinite(actions).all()
    # The same numbers as the edge runtime on the registry copy, and as the export's reference.
    from deploy_edge.exported import ExportedPolicy

    edge = ExportedPolicy(export_dir).infer(
        {"scene": feeds["image_scene"]},
        feeds["state"],
        [dataset.tasks[int(frames["task_index"][0])]],
    )
    np.testing.assert_allclose(actions, edge, atol=1e-6)
    reference = np.load(export_dir / "reference.npz")
    expected = session.run(["actions"], {k: reference[k] for k in feeds})[0]
    np.testing.assert_allclose(expected, reference["expected_actions"], atol=1e-5)


def test_a_failed_gate_keeps_the_champion(
    first_run: dict[str, Any], gated_run: dict[str, Any]
) -> None:
    from pipelines.registry.versions import champion, get_version

    result = gated_run
    assert not result["promoted"] and result["blocked_by"] == ["latency"]
    assert result["version"] != first_run["version"] and result["aliases"] == ["candidate"]
    assert result["device"] is None and "deploy" not in result["stages"], "only champions ship"
    assert champion(MODEL).version == first_run["version"]  # type: ignore[union-attr]
    comparison = result["gates"]["no regression vs champion"]
    assert f"vs v{first_run['version']}" in comparison["measured"], "on the champion's seeds"
    reused = {name for name, s in result["stages"].items() if s["reused"]}
    assert {"collect", "pretrain"} <= reused and "finetune" not in reused
    # The version says which gate failed, with what was measured and what was required.
    tags = get_version(MODEL, result["version"]).tags
    latency = result["gates"]["latency"]
    assert tags[GATE_TAG + "latency"] == "failed"
    assert (
        tags[GATE_TAG + "latency.required"]
        == latency["required"]
        == ("p99 <= 0.0001 ms, misses <= 0")
    )
    assert tags[GATE_TAG + "latency.measured"] == latency["measured"]
    assert latency["measured"].startswith("p99 ") and "ms" in latency["measured"]


def test_models_cli_lists_shows_promotes_and_rolls_back(
    first_run: dict[str, Any], gated_run: dict[str, Any], shared_home: Path
) -> None:
    champion, failed = first_run["version"], gated_run["version"]
    listed = robo_pipe("models", "list", "--json", home=shared_home)
    assert listed.returncode == 0, listed.stderr
    models = {m["name"]: m for m in json.loads(listed.stdout.strip().splitlines()[-1])}
    numbers = [v["version"] for v in models[MODEL]["versions"]]
    assert {champion, failed} <= set(numbers) and numbers == sorted(numbers, key=int)[::-1]

    refused = robo_pipe("models", "promote", f"{MODEL}/{failed}", home=shared_home)
    assert refused.returncode == 1 and "failed gates: latency" in refused.stderr
    uri = f"models:/{MODEL}/{failed}"
    forced = robo_pipe("models", "promote", uri, "--force", home=shared_home)
    assert forced.returncode == 0, forced.stderr
    shown = robo_pipe("models", "show", f"{MODEL}@champion", "--json", home=shared_home)
    record = json.loads(shown.stdout.strip().splitlines()[-1])[0]
    assert record["version"] == failed and "--force" in record["tags"]["robo_pipe.promoted_by"]

    back = robo_pipe("models", "rollback", MODEL, home=shared_home)
    assert back.returncode == 0 and f"v{champion}" in back.stderr
    again = robo_pipe("models", "rollback", MODEL, home=shared_home)
    assert again.returncode == 2 and "nothing to roll back" in again.stderr

    missing = robo_pipe("models", "show", "no-such-policy", home=shared_home)
    assert missing.returncode == 2 and f"registered models: {MODEL}" in missing.stderr
    evaluate = robo_pipe("evaluate", "models:/no-such-policy@champion", home=shared_home)
    assert evaluate.returncode == 2 and MODEL in evaluate.stderr


def test_resume_reuses_completed_stages_after_a_failure(
    first_run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import deploy_edge.latency
    import pipelines.config
    import stages.export.onnx

    real_gate, real_export = deploy_edge.latency.run_gate, stages.export.onnx.export
    calls = {"gate": 0, "export": 0}
    failures: list[BaseException] = [RuntimeError("injected: the gate machine fell over")]

    def flaky_gate(*args: Any, **kwargs: Any) -> Any:
        calls["gate"] += 1
        if failures:
            raise failures.pop(0)
        return real_gate(*args, **kwargs)

    def counted_export(*args: Any, **kwargs: Any) -> Any:
        calls["export"] += 1
        return real_export(*args, **kwargs)

    monkeypatch.setattr(deploy_edge.latency, "run_gate", flaky_gate)
    monkeypatch.setattr(stages.export.onnx, "export", counted_export)
    read = pipelines.config._read_yaml
    reads: list[Path] = []

    def counted_read(path: Path, *args: Any) -> Any:
        reads.append(path)
        return read(path, *args)

    monkeypatch.setattr(pipelines.config, "_read_yaml", counted_read)
    # New inputs (nothing of the earlier runs applies), registered under a name of its own so
    # that no other test's champion moves.
    other_seed = ["seed=7", "registry.model_name=demo-policy-resume"]
    with pytest.raises(RuntimeError, match="injected"):
        run_pipeline(*other_seed)
    assert calls == {"gate": 1, "export": 1}, "a permanent error is not retried"
    assert reads.count(Path(CONFIG)) == 1, "a run from a path (a schedule's) reads it once"

    # The re-run continues at the failed stage; a transient error there is retried by Prefect.
    failures.append(ConnectionError("injected: connection reset"))
    result = run_pipeline(*other_seed)
    assert calls == {"gate": 3, "export": 1}, "export was not recomputed"
    reused = {name for name, s in result["stages"].items() if s["reused"]}
    assert reused == {"collect", "pretrain", "finetune", "export", "evaluate"}
    assert result["version"] == "1" and Path(result["run_dir"], "summary.md").is_file()


def test_bad_config_stops_before_any_stage(first_run: dict[str, Any], shared_home: Path) -> None:
    from pipelines.run.flow import train_simulate_deploy

    stages_before = sorted((shared_home / "stages").iterdir())
    with pytest.raises(ConfigError, match=r"evaluate\.episodes"):
        train_simulate_deploy(config=CONFIG, overrides=[*TINY, "evaluate.episodes=-3"])
    assert sorted((shared_home / "stages").iterdir()) == stages_before


def test_the_prefect_ui_asks_for_a_config_path() -> None:
    """The flows take a loaded config from Python (``robo-pipe run``), but the Prefect UI and
    the deployments' parameters show ``config`` as one text field: a YAML path."""
    from prefect.utilities.callables import parameter_schema

    from pipelines.run.flow import champion_regression, train_simulate_deploy

    for flow in (train_simulate_deploy, champion_regression):
        config = parameter_schema(flow.fn).properties["config"]
        assert config["type"] == "string" and config["default"] == "configs/demo.yaml", config


def flow_run_id(result: dict[str, Any]) -> str:
    """The id of the Prefect flow run of ``result``."""
    return str(result["links"]["Prefect flow run"].rsplit("/", 1)[1])


def flow_run_summary(result: dict[str, Any]) -> str:
    """The markdown summary artifact the flow run of ``result`` published in Prefect."""
    from prefect.client.orchestration import get_client

    run_id = flow_run_id(result)
    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts()
    (summary,) = [
        a for a in artifacts if str(a.flow_run_id) == run_id and a.key == "demo-pipeline-summary"
    ]
    return str(summary.data)


def cli_env() -> dict[str, str]:
    """A CLI subprocess reports to this module's Prefect test server."""
    from prefect.settings import PREFECT_API_URL

    return {"PREFECT_API_URL": str(PREFECT_API_URL.value())}


def test_run_below_min_success_is_registered_not_promoted(
    first_run: dict[str, Any], shared_home: Path
) -> None:
    """`robo-pipe run` with a bar the candidate does not reach: a version, no champion, and the
    CLI, the Prefect summary and the version's tags all say which gate failed and by how much."""
    from pipelines.registry.versions import champion, get_version

    name = "demo-policy-strict"  # its own registry entry: no other test's champion moves
    sets = [*TINY, f"registry.model_name={name}", "registry.promotion.min_success=0.9"]
    args = [arg for s in sets for arg in ("--set", s)]
    run = robo_pipe("run", "-c", CONFIG, *args, "--json", home=shared_home, **cli_env())
    assert run.returncode == 1, run.stderr[-3000:]  # the verdict's exit code
    assert "verdict: blocked" in run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # Its log (stderr is piped, as in CI): each stage's one line as it ended, ok or reused.
    lines = run.stderr.splitlines()
    for stage, done in result["stages"].items():
        ok, reused = f"{stage}: ok in ", f"{stage}: reused (an earlier run's): "
        ends = [line for line in lines if line.startswith((ok, reused))]
        assert len(ends) == 1 and ends[0].startswith(reused if done["reused"] else ok), ends
    assert result["success_rate"] < 0.9 and not result["promoted"]
    assert result["blocked_by"] == ["held-out success"] and result["aliases"] == ["candidate"]
    assert champion(name) is None
    low = f"{result['ci95'][0]:.1%}"  # compared with the bar (min_success_on: lower_bound)
    measured = f"lower end {low} (estimate {result['success_rate']:.1%}, 95% CI {low} - "
    required = ">= 90% (lower end of the 95% CI)"
    shown = " ".join(run.stderr.split())  # the gates table, whatever its wrapping
    assert "held-out success" in shown and "FAIL" in shown and ">= 90%" in shown
    assert f"lower end {low}" in shown
    assert f"registered models:/{name}/1 as candidate; champion unchanged" in shown
    assert "(failed: held-out success)" in shown

    summary = flow_run_summary(result)
    assert f"| held-out success | FAIL | {measured}" in summary and f"| {required} |" in summary
    tags = get_version(name, "1").tags
    assert tags[GATE_TAG + "held-out success"] == "failed"
    assert tags[GATE_TAG + "held-out success.required"] == required
    assert tags[GATE_TAG + "held-out success.measured"].startswith(measured)
    assert failed_gates(get_version(name, "1").tags) == ["held-out success"]

    # The CLI read and checked the config once and handed it to the flow as it was: the flow
    # run's parameter is the resolved config (as saved in the run folder), not a path to read.
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        parameters = prefect.read_flow_run(UUID(flow_run_id(result))).parameters
    saved = yaml.safe_load((Path(result["run_dir"]) / "config.yaml").read_text())
    assert parameters["config"] == saved and not parameters["overrides"]


REGRESS = [
    "evaluate.episodes=40",  # 80 shared seeds: enough to tell ~10% from 0%
    "registry.model_name=demo-policy-regress",
]


@pytest.fixture(scope="module")
def regress_champion(first_run: dict[str, Any], shared_home: Path) -> dict[str, Any]:
    """The tiny policy as champion of its own registry entry, measured on 80 seeds (it drifts
    onto an object on about one in ten)."""
    result = run_pipeline(*REGRESS, home=shared_home)
    assert result["promoted"] and result["success_rate"] >= 0.05, result["success_rate"]
    return result


def test_a_candidate_worse_than_the_champion_on_the_same_seeds_is_not_promoted(
    regress_champion: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deliberately broken model: its exported actions are zeroed (the arm never moves).
    It clears ``min_success`` (0 in these tests) and the latency gate, but loses to the
    champion on the same seeds, so the champion stays."""
    from pipelines.registry.tags import COMPARISON_TAG, OUTCOMES_TAG
    from pipelines.registry.versions import champion, get_version
    from stages.policy.onnx_graph import OnnxPolicy

    real_forward = OnnxPolicy.forward

    def zeroed(self: OnnxPolicy, *inputs: Any) -> Any:
        actions, std = real_forward(self, *inputs)
        return actions * 0.0, std

    monkeypatch.setattr(OnnxPolicy, "forward", zeroed)
    # one more step: a new checkpoint, so a new export (with the zeroed actions)
    result = run_pipeline(*REGRESS, "finetune.bc.steps=11")
    name, held = "demo-policy-regress", regress_champion["version"]
    assert result["success_rate"] == 0.0 and result["version"] != held
    assert not result["promoted"] and result["blocked_by"] == ["no regression vs champion"]
    assert champion(name).version == held  # type: ignore[union-attr]
    gate = result["gates"]["no regression vs champion"]
    # Paired and sequential: the champion's per-seed outcomes, stored with its version when
    # it was registered, are reused (it plays no seed again); the comparison stops at the
    # first look whose exact McNemar p crosses its boundary.
    comparison = result["comparison"]
    seeds, looks = comparison["seeds"], comparison["looks"]
    assert comparison["test"] == "exact McNemar" and comparison["decision"] == "worse"
    assert looks[-1] == 40 and len(looks) == 10 and seeds in looks
    assert comparison["baseline_reused"] == 2 * seeds, "the champion was not played again"
    assert comparison["discordant"]["candidate_only"] == 0
    assert comparison["p_value"] <= comparison["boundary"]
    difference = comparison["difference"]
    assert gate["measured"].startswith(f"{difference:+.1%} vs v{held}, p = ")
    assert result["gates"]["held-out success"]["passed"] and result["gates"]["latency"]["passed"]
    tags = get_version(name, result["version"]).tags
    assert tags[GATE_TAG + "no regression vs champion"] == "failed"
    assert tags[COMPARISON_TAG + "baseline_only"] == str(comparison["discordant"]["baseline_only"])
    assert float(tags[COMPARISON_TAG + "p_value"]) == pytest.approx(comparison["p_value"], rel=1e-5)
    assert tags[COMPARISON_TAG + "played_on"] == "0", "a worse one never plays on"
    summary = flow_run_summary(result)
    assert "| no regression vs champion | FAIL |" in summary
    assert "| **candidate failed** |" in summary and "80% power" in summary
    stored = get_version(name, held).tags
    outcomes = {k: v for k, v in stored.items() if k.startswith(OUTCOMES_TAG)}
    assert len(outcomes) == 2 and all(len(v) == 40 for v in outcomes.values())
    assert sum(v.count("1") for v in outcomes.values()) == round(
        regress_champion["success_rate"] * 80
    )
    # `robo-pipe evaluate --baseline models:/...` compares with the stored outcomes too.
    args = ["--config", CONFIG, *(a for o in [*TINY, *REGRESS] for a in ("--set", o))]
    cli = robo_pipe(
        "evaluate",
        result["export"],
        "--baseline",
        f"models:/{name}@champion",
        "--json",
        *args,
        home=Path(os.environ["ROBO_PIPE_HOME"]),
    )
    assert cli.returncode in (0, 1), cli.stderr[-3000:]  # the zeroing above is in-process
    again = json.loads(cli.stdout)["comparison"]
    assert again["baseline_reused"] == 2 * again["seeds"] > 0, "the champion was not played"
    assert (cli.returncode == 1) == (again["decision"] == "worse")


def test_champion_check_fails_when_the_champion_falls_below_the_bar(
    regress_champion: dict[str, Any], shared_home: Path
) -> None:
    """`robo-pipe models check` runs the champion_regression flow: it holds the champion to
    ``min_success`` on the held-out suite; below it the flow run ends Failed in Prefect and
    the command exits 1, and the version's tags record the check."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    from pipelines.registry.tags import LAST_REGRESSION_SUCCESS_TAG
    from pipelines.registry.versions import get_version

    name, version = "demo-policy-regress", regress_champion["version"]
    sets = [*TINY, *REGRESS, "evaluate.episodes=6"]
    args = [arg for s in sets for arg in ("--set", s)]

    def check(min_success: str) -> tuple[subprocess.CompletedProcess[str], str]:
        bar = ["--set", f"registry.promotion.min_success={min_success}"]
        run = robo_pipe("models", "check", "-c", CONFIG, *args, *bar, home=shared_home, **cli_env())
        with get_client(sync_client=True) as prefect:
            (latest,) = prefect.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["champion_regression"])),
                sort=FlowRunSort.START_TIME_DESC,
                limit=1,
            )
        assert latest.state is not None
        return run, latest.state.type.value

    held, state = check("0.0")
    assert held.returncode == 0, held.stderr[-3000:]
    # the verdict is the command's result: on stdout, where a pipe or a CI step reads it
    assert state == "COMPLETED" and f"champion {name} v{version} holds" in held.stdout
    checked = get_version(name, version).tags[LAST_REGRESSION_SUCCESS_TAG]

    regressed, state = check("0.95")
    assert regressed.returncode == 1, regressed.stderr[-3000:]
    assert state == "FAILED"
    verdict = " ".join(regressed.stdout.split())
    assert f"regression: champion {name} v{version}: held-out success" in verdict
    assert "required >= 95% (lower end of the 95% CI)" in verdict
    assert "Traceback" not in regressed.stderr
    tags = get_version(name, version).tags
    assert tags[LAST_REGRESSION_SUCCESS_TAG] == checked, "the same seeds"


@pytest.mark.parametrize(
    ("args", "env", "named", "code"),
    [
        (["--set", "latency.steps=zero"], {}, "latency.steps", 2),
        (["--ray-address", "127.0.0.1:{port}"], {}, "Ray cluster at '127.0.0.1:{port}'", 2),
        # A configured server that does not answer: a service failed, the input is fine (3).
        ([], {"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"}, "MLflow tracking server", 3),
        ([], {"PREFECT_API_URL": "http://127.0.0.1:{port}/api"}, "Prefect API", 3),
    ],
    ids=["config", "ray", "mlflow", "prefect"],
)
def test_unreachable_services_are_named(
    args: list[str], env: dict[str, str], named: str, code: int, tmp_path: Path
) -> None:
    port = str(free_port())
    args = [a.replace("{port}", port) for a in args]
    env = {k: v.replace("{port}", port) for k, v in env.items()}
    result = robo_pipe("run", "--config", CONFIG, *args, home=tmp_path / "home", **env)
    assert result.returncode == code, result.stderr
    assert named.replace("{port}", port) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "home" / "stages").exists() or not any(
        (tmp_path / "home" / "stages").iterdir()
    )


def test_finetune_cli_runs_bc_then_ppo(first_run: dict[str, Any], shared_home: Path) -> None:
    """`robo-pipe finetune --algo ppo`: the BC warm start (reused from the pipeline), then RL."""
    from stages.finetune.checkpoints import read_metrics
    from stages.policy.checkpoint import read_policy_meta

    sets = [arg for s in TINY for arg in ("--set", s)]
    result = robo_pipe("finetune", "-c", CONFIG, "--algo", "ppo", *sets, "--json", home=shared_home)
    assert result.returncode == 0, result.stderr[-3000:]
    ref = json.loads(result.stdout.strip().splitlines()[-1])
    run_dir = Path(ref["path"]).parent
    assert "-ppo-" in run_dir.name and ref["step"] == 2 and ref["trainable"] == "lora"
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    assert (run_dir / "learning_curves.png").is_file()
    assert "training-episode success" in result.stderr, "an RL checkpoint shows RL figures"
    assert "action loss nan" not in result.stderr and "samples/s 0" not in result.stderr
    lineage = read_policy_meta(ref["path"])["lineage"]
    assert lineage["stage"] == "finetune-ppo" and "-finetune-" in lineage["start_checkpoint"]

    bad = robo_pipe("finetune", "-c", CONFIG, "--algo", "dqn", home=shared_home)
    assert bad.returncode == 2 and "finetune.algo" in bad.stderr and "dqn" in bad.stderr


def test_rl_demo_pipeline_reports_the_bc_warm_start_beside_the_rl_result(
    first_run: dict[str, Any],
) -> None:
    """configs/rl-demo.yaml, tiny: collect, BC, then RL (its algorithm, a few iterations) in the
    pipeline's finetune stage; the evaluation puts the BC warm start beside the RL result on the
    same seeds, with the failure breakdown, and MLflow gets the RL learning curves."""
    from mlflow import MlflowClient

    from pipelines.config import load_config

    rl_demo = str(CONFIG_DIR / "rl-demo.yaml")
    algo = load_config(rl_demo).finetune.algo
    assert algo in ("ppo", "grpo", "sac")
    result = run_pipeline(*tiny_overrides(), "deploy.local_agent=false", config=rl_demo)
    assert f"-{algo}-" in result["checkpoint"]
    assert result["warm_start_success_rate"] is not None and len(result["warm_start_ci95"]) == 2
    client = MlflowClient()
    parent = client.get_run(result["mlflow_run_id"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    stage = {r.data.tags["robo_pipe.stage"]: r for r in children}
    logged = stage["evaluate"].data.metrics["warm_start_success_rate"]
    assert logged == result["warm_start_success_rate"]
    finetune = stage["finetune"]
    assert len(client.get_metric_history(finetune.info.run_id, "env_steps_per_s")) == 2
    assert "plots/learning_curves.png" in {
        a.path for a in client.list_artifacts(finetune.info.run_id, "plots")
    }
    assert "plots/learning_curves.png" in {
        a.path for a in client.list_artifacts(parent.info.run_id, "plots")
    }
    summary_md = (Path(result["run_dir"]) / "summary.md").read_text()
    assert "2 RL iterations" in summary_md
    assert "| BC warm start | all |" in summary_md and "RL in simulation took it from" in summary_md
    assert "Paired: RL alone solved" in summary_md and "exact McNemar p = " in summary_md
    assert result["rl_gain"]["seeds"] == load_config(rl_demo, tiny_overrides()).evaluate.episodes
    assert "Why episodes failed: candidate: wrong object" in summary_md
    report = json.loads(
        (Path(result["run_dir"]) / "evaluate-warm-start" / "eval_report.json").read_text()
    )
    assert set(report["failures"]) >= {"wrong_object", "near_miss", "timeout"}


def test_a_device_that_already_runs_the_champion_keeps_it(first_run: dict[str, Any]) -> None:
    """Deploying the champion the local agent already runs (a re-run of the demo) changes
    nothing there: reported active, and an episode still runs."""
    from pipelines.config import load_config
    from pipelines.deploy.local_agent import deploy_to_local_agent
    from pipelines.records import Registration

    cfg = load_config(CONFIG, TINY)
    champion = Registration(MODEL, first_run["version"], [], True, [], {}, "")
    deploy_to_local_agent(cfg, champion)  # other tests' champions may have gone there since
    again = deploy_to_local_agent(cfg, champion)
    assert again.state == "active" and again.reason == "already runs this release", again
    assert again.episode_ticks == 10 and again.model_version == first_run["version"]
    # where it runs is on the version, as `robo-pipe models show` lists it
    from pipelines.registry.tags import DEVICE_TAG
    from pipelines.registry.versions import get_version

    tags = get_version(MODEL, first_run["version"]).tags
    where = f"{DEVICE_TAG}local-agent."
    assert tags[where + "version"] == f"{MODEL}:{first_run['version']}", tags
    assert tags[where + "state"] == "active" and tags[where + "at"].endswith("Z"), tags


def test_every_policy_verb_reads_a_version_an_export_or_a_checkpoint_alike(
    first_run: dict[str, Any], shared_home: Path, tmp_path: Path
) -> None:
    """One reading of a policy argument (``checks.resolve_policy``): gate times a registry
    version (its export), and what a verb cannot use is refused in one line, exit 2, saying
    what to pass instead."""
    quick = ["--steps", "20", "--warmup", "2", "--no-pace", "--json"]
    gated = robo_pipe("gate", f"{MODEL}@champion", *quick, home=shared_home)
    assert gated.returncode == 0, gated.stderr[-3000:]
    assert json.loads(gated.stdout.strip().splitlines()[-1])["steps"] == 20
    checkpoint, export = first_run["checkpoint"], first_run["export"]
    refused = {
        ("gate", checkpoint): "export it first (robo-pipe export",
        ("export", f"models:/{MODEL}@champion"): "it is exported already",
        ("bundle", export): "a pipeline run registers its export",
        ("deploy", checkpoint, "--device", "local-agent"): "a pipeline run registers its export",
        ("evaluate", str(tmp_path)): "not a policy: neither a checkpoint",
    }
    for args, said in refused.items():
        done = robo_pipe(*args, home=shared_home)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def readme_next_steps() -> list[str]:
    """The commands of the README's next-steps block (the one its marker names), comments
    dropped."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- next-steps:", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def test_the_readme_next_steps_run_as_written(first_run: dict[str, Any], shared_home: Path) -> None:
    """After a run, every command of the README's next steps runs as written (the home's
    ``.robo-pipe/`` is this test's home): the demo's local agent starts again from the files
    the run left, and the verbs reach it through the devices file the run wrote."""
    commands = [line.replace(".robo-pipe/", f"{shared_home}/") for line in readme_next_steps()]
    agent_line = next(c for c in commands if c.startswith("robo-pipe edge-agent"))
    rest = [c for c in commands if c != agent_line]
    assert any("robo-pipe deploy" in c for c in rest) and any("fleet status" in c for c in rest)
    env = {
        **os.environ,
        "ROBO_PIPE_HOME": str(shared_home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "100",
    }
    from pipelines.deploy.local_agent import TOKEN_ENV

    env.pop(TOKEN_ENV, None)  # the README's export sets it, not this process
    devices = yaml.safe_load((shared_home / "edge" / "devices.yaml").read_text())["devices"]
    url = devices[0]["url"]
    agent = subprocess.Popen(
        ["bash", "-c", f"exec {agent_line}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_health(url, agent)
        exports: list[str] = []
        said: dict[str, str] = {}  # verb -> its stdout
        for command in rest:
            if command.startswith("export "):
                exports.append(command)
                continue
            done = subprocess.run(
                ["bash", "-c", "\n".join([*exports, command])],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
            said[command.split()[1]] = done.stdout
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    # It answered, naming what it runs: this module's tests deploy several of the home's models
    # onto the same local agent, in whatever order the suite runs them.
    assert re.search(rf"{MODEL}[\w-]*:\d+", said["devices"]), said
    assert "local-agent" in said["fleet"], said


def wait_for_health(url: str, process: subprocess.Popen[str]) -> None:
    """Until the agent at ``url`` answers ``/healthz`` (its process must not exit first)."""
    import time

    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"the local agent at {url} did not answer")


def flow_run_of(result: dict[str, Any]) -> Any:
    """The Prefect flow run of ``result``, as the server has it now."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        return prefect.read_flow_run(UUID(flow_run_id(result)))


def run_artifact(result: dict[str, Any], key: str) -> Any:
    """The artifact ``key`` the flow run of ``result`` published."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts()
    (found,) = [a for a in artifacts if str(a.flow_run_id) == flow_run_id(result) and a.key == key]
    return found


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")
"""A Markdown image; its group: where the image is."""


def test_the_summary_opens_anywhere(first_run: dict[str, Any], shared_home: Path) -> None:
    """summary.md shows the PNGs beside it, names paths relative to the home, and links to no
    server this machine happened to run (the test's Prefect server, a `robo-pipe ui`'s ports);
    the Prefect artifact is the same text with the same PNGs inline."""
    from mlflow import MlflowClient

    run_dir = Path(first_run["run_dir"])
    text = (run_dir / "summary.md").read_text()
    images = IMAGE.findall(text)
    assert len(images) >= 3, "training curves, evaluation, latency"
    for image in images:
        assert not Path(image).is_absolute() and "://" not in image, image
        assert (run_dir / image).is_file(), f"{image} is not beside summary.md"
    assert str(shared_home) not in text and str(shared_home.resolve()) not in text
    absolute = re.findall(r"(?:^|[\s`(])(/[\w.-]+/\S*)", text, flags=re.MULTILINE)
    assert not absolute, absolute
    ports = (f":{port}" for port in preferred_ports())
    for port_bound in ("127.0.0.1", "localhost", *ports):
        assert port_bound not in text, f"{port_bound}: a link only this machine's servers answer"
    assert f"`{run_dir.relative_to(shared_home)}`" in text
    assert "`robo-pipe ui`" in text and flow_run_id(first_run) in text

    # The Prefect artifact: the same text, each image the same PNG inline.
    artifact = str(run_artifact(first_run, "demo-pipeline-summary").data)
    inline = IMAGE.findall(artifact)
    assert len(inline) == len(images)
    for uri, image in zip(inline, images, strict=True):
        assert uri.startswith("data:image/png;base64,"), uri[:40]
        assert base64.b64decode(uri.split(",", 1)[1]) == (run_dir / image).read_bytes()
        artifact = artifact.replace(uri, image)
    assert artifact == text

    # The MLflow artifacts keep the layout: summary.md with its plots/ beside it.
    mlflow = MlflowClient()
    logged = {a.path for a in mlflow.list_artifacts(first_run["mlflow_run_id"], "plots")}
    assert {f"plots/{Path(image).name}" for image in images} <= logged
    assert all(image.startswith("plots/") for image in images)


def test_the_verdict_shows_in_prefect_and_mlflow(
    first_run: dict[str, Any], gated_run: dict[str, Any]
) -> None:
    """The flow run is named after the config and its outcome and ends in a state named after
    the verdict; the gates table says pass/FAIL and renders as written; the MLflow experiment
    is a model-training one and the pipeline's run says what happened."""
    from mlflow import MlflowClient

    from pipelines.tracking import client

    promoted, blocked = flow_run_of(first_run), flow_run_of(gated_run)
    assert promoted.name == f"demo · promoted v{first_run['version']}"
    assert promoted.state.name == "Promoted" and promoted.state.is_completed()
    assert blocked.name == f"demo · v{gated_run['version']} BLOCKED (latency)"
    assert blocked.state.name == "Blocked" and blocked.state.is_completed()

    rows = json.loads(run_artifact(gated_run, "demo-gates").data)
    assert {r["gate"]: r["result"] for r in rows} == {
        "held-out success": "pass",
        "no regression vs champion": "pass",
        "latency": "FAIL",
        # local-cpu is sync, and its tick fits its period: no delay to play
        "success at device latency": "pass",
    }
    assert {r["gate"]: r["measured"] for r in rows}["success at device latency"].startswith(
        "none: sync, the tick's p99"
    )
    cells = [str(v) for row in rows for v in row.values()]
    assert not [c for c in cells if c.lstrip().startswith(">")], "a cell read as a blockquote"
    assert "≤ 0.0001 ms" in {r["gate"]: r["required"] for r in rows}["latency"]
    (latency,) = json.loads(run_artifact(gated_run, "demo-latency").data)
    assert latency["result"] == "FAIL"
    for result in (first_run, gated_run):
        summary = (Path(result["run_dir"]) / "summary.md").read_text()
        assert not [line for line in summary.splitlines() if line.startswith(">")]
        assert "True" not in summary
        # latency.sweep: the sweep's table and plot, in the summary and in Prefect's artifact
        swept = result is gated_run
        assert ("## Success against inference delay" in summary) == swept
        assert ("### success against inference delay" in summary) == swept
    artifact = str(run_artifact(gated_run, "demo-pipeline-summary").data)
    section = artifact.split("## Success against inference delay")[1].split("##")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "ticks" in line]
    assert [row.split(" ticks")[0] for row in rows][:2] == ["| 0", "| 1"], section
    assert "<- the device's" in section and "not played: a chunk of 3 actions" in section
    assert "![success against inference delay](data:image/png;base64," in artifact

    mlflow = MlflowClient()
    run = mlflow.get_run(gated_run["mlflow_run_id"])
    experiment = mlflow.get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    described = run.data.tags["mlflow.note.content"]
    assert (
        f"v{gated_run['version']} BLOCKED (latency)" in described
        and "latency **FAIL**" in described
    )
    children = mlflow.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'"
    )
    (stage,) = [r for r in children if r.data.tags["robo_pipe.stage"] == "latency"]
    artifacts = [a.path for a in mlflow.list_artifacts(stage.info.run_id, "latency")]
    assert "latency/delay_sweep.json" in artifacts and "latency/delay_sweep.png" in artifacts, (
        artifacts
    )
    plots = [a.path for a in mlflow.list_artifacts(run.info.run_id, "plots")]
    assert "plots/delay_sweep.png" in plots, plots
    first = mlflow.get_run(first_run["mlflow_run_id"]).data.tags["mlflow.note.content"]
    assert f"promoted v{first_run['version']}" in first
    # MLflow's own promote path is named on the version, where its button is.
    description = str(client().get_model_version(MODEL, gated_run["version"]).description)
    assert "bypass the gates" in description and "robo-pipe models promote" in description


def test_a_champion_that_skipped_the_gates_is_flagged(
    first_run: dict[str, Any], gated_run: dict[str, Any], shared_home: Path
) -> None:
    """MLflow's own alias editing (its UI, its API) moves ``champion`` past every gate:
    `robo-pipe models list` and `models show` flag a champion that did not pass them."""
    from pipelines.registry.versions import champion
    from pipelines.tracking import client

    def listed() -> tuple[dict[str, Any], str]:
        out = robo_pipe("models", "list", "--json", home=shared_home)
        assert out.returncode == 0, out.stderr
        records = json.loads(out.stdout.strip().splitlines()[-1])
        return {r["name"]: r for r in records}[MODEL], out.stderr

    record, stderr = listed()
    assert record["champion_warning"] is None and "without passing the gates" not in stderr
    before = champion(MODEL)
    assert before is not None
    failed = gated_run["version"]  # failed the latency gate
    client().set_registered_model_alias(MODEL, "champion", failed)  # as MLflow's UI does
    try:
        record, stderr = listed()
        warning = f"{MODEL} v{failed} is champion without passing the gates: made champion "
        assert record["champion_warning"].startswith(warning) and warning in " ".join(
            stderr.split()
        )
        shown = robo_pipe("models", "show", f"models:/{MODEL}@champion", home=shared_home)
        assert shown.returncode == 0, shown.stderr
        assert "outside robo-pipe" in " ".join((shown.stdout + shown.stderr).split())
    finally:
        client().set_registered_model_alias(MODEL, "champion", before.version)
