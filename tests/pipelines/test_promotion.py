"""Promotion is a compare-and-set: a candidate evaluated against an older champion is compared
again with the champion there is when it registers, on the same seeds, before ``champion``
may move (a real SQLite MLflow registry; the episodes' outcomes are written as the evaluate
stage writes them)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import tracking
from pipelines.config import PipelineConfig, load_config
from pipelines.records import Evaluation, Registration
from pipelines.registry.champion import outcome_tags, outcomes_key
from pipelines.registry.exports import register_export
from pipelines.registry.promotion import RandomWeightsError, champion_history, promote
from pipelines.registry.tags import (
    ONNX_HASH_TAG,
    OUTCOMES_KEY_TAG,
    PROMOTED_ON_TAG,
    PROMOTED_OVER_TAG,
    RANDOM_WEIGHTS_TAG,
)
from pipelines.registry.versions import champion, get_version
from pipelines.steps.register import register_version
from stages.evaluate import suite_variants
from stages.evaluate.report import EvalReport, VariantRow
from stages.evaluate.sequential import encode_outcomes
from stages.register import GATE_TAG
from stages.register.gates import AT_LATENCY, NO_REGRESSION
from tests.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]

SETS = ["evaluate.episodes=10", "registry.promotion.min_success=0.0"]
"""On the tiny profile: suites of 10 seeds per variant, and no success bar (these tests are
about the comparison with the champion)."""


@pytest.fixture
def cfg(robo_pipe_home: Path) -> PipelineConfig:
    from pipelines.services.settings import configure

    configure()
    return load_config(TINY_CONFIG, [*SETS, "registry.model_name=cas-policy"])


@pytest.fixture
def bundle(export_dir: Path) -> Path:
    """A tiny exported policy: every version below registers it (they differ by their tags)."""
    return export_dir


def report(cfg: PipelineConfig, wins: int, folder: Path) -> EvalReport:
    """A report of the config's suite (its variants and ``eval`` seeds) with ``wins`` successes
    per variant, written as the evaluate stage writes it."""
    from sim_scenes.seeds import episode_seeds

    variants = suite_variants(cfg.scene, cfg.evaluate)
    n = cfg.evaluate.episodes
    seeds = episode_seeds(cfg.seed, n, "eval")
    outcomes = [
        {"variant": v, "index": i, "seed": s, "success": i < wins, "length": 20, "return": 0.0}
        for v in variants
        for i, s in enumerate(seeds)
    ]
    total = wins * len(variants)
    folder.mkdir(parents=True)
    made = EvalReport(
        policy=str(folder),
        episodes=n * len(variants),
        successes=total,
        success_rate=total / (n * len(variants)),
        ci95=(0.0, 1.0),
        rows=[VariantRow(v, n, wins, wins / n, (0.0, 1.0), 20.0) for v in variants],
        env_steps_per_s=1.0,
        episodes_per_s=1.0,
        wall_s=1.0,
        startup_s=0.0,
        time_share={},
        workers=0,
        replacements=0,
        seed=cfg.seed,
        seeds=list(seeds),
        outcomes=outcomes,
        report=str(folder / "report.md"),
    )
    (folder / "report.md").write_text("# report\n")
    (folder / "eval_report.json").write_text(json.dumps(made.to_json()))
    return made


def register_champion(
    cfg: PipelineConfig, bundle: Path, onnx_hash: str, tags: dict[str, str]
) -> str:
    """A version promoted as another run would have promoted it."""
    run = tracking.TrackedRun.start("cas-tests", "register")
    info = register_export(bundle, cfg.model_name, run, {ONNX_HASH_TAG: onnx_hash, **tags})
    run.finish()
    return promote(cfg.model_name, info.version, "test").version


def champion_version(cfg: PipelineConfig) -> str:
    current = champion(cfg.model_name)
    assert current is not None, "the model has a champion"
    return current.version


def stored_results(cfg: PipelineConfig, made: EvalReport) -> dict[str, str]:
    """The per-seed outcome tags a version gets when it is registered."""
    return outcome_tags(cfg, encode_outcomes(made.successes_by_episode()))


def candidate_registers(
    cfg: PipelineConfig,
    bundle: Path,
    onnx_hash: str,
    made: EvalReport,
    compared_with: str,
    latency_folder: Path | None = None,
) -> Registration:
    """``register_version`` of a candidate whose evaluation compared it with ``compared_with``
    and passed (its record is compact, as the evaluate stage hands it on); its latency report
    in ``latency_folder`` (None: no report, nothing played at a delay)."""
    from dataclasses import replace

    from deploy_edge.latency_report import LatencyReport
    from stages.dataset.layout import DatasetRef
    from stages.evaluate.comparison import compare_outcomes
    from stages.evaluate.sequential import plan_looks
    from stages.export import ExportRef
    from stages.policy.checkpoint import CheckpointRef

    plan = plan_looks(1, 1, 0.05, 0.2, 0.05, 0.0, "pocock")
    passed = compare_outcomes({}, {}, plan, 0, ("not worse", "", 0.05), f"v{compared_with}")
    evaluation = Evaluation(
        candidate=replace(made, outcomes=[], seeds=[], comparison=passed),
        champion_version=compared_with,
    )
    latency = LatencyReport.from_json(
        {
            "export": str(bundle),
            "target": "host-cpu",
            "passed": True,
            "reasons": [],
            "budget_ms": 100.0,
            "allowed_misses": 0,
            "steps": 10,
            "warmup": 1,
            "p50_ms": 1.0,
            "p95_ms": 1.0,
            "p99_ms": 1.0,
            "max_ms": 1.0,
            "mean_ms": 1.0,
            "jitter_ms": 0.0,
            "misses": 0,
            "errors": 0,
            "inference_ticks": 10,
            "report": str(latency_folder / "latency_report.json") if latency_folder else "",
        }
    )
    dataset = DatasetRef(str(bundle), "d" * 64, 1, 1, 10.0, "rp5", "v", {})
    checkpoint = CheckpointRef(str(bundle), "c" * 64, "default", "lora", 1, 1, 1)
    export = ExportRef(str(bundle), str(bundle), onnx_hash, "", "", 0.0, {}, 18)
    run = tracking.TrackedRun.start("cas-tests", "candidate")
    try:
        return register_version(cfg, dataset, checkpoint, export, evaluation, latency, run, "test")
    finally:
        run.finish()


def test_a_candidate_compared_with_an_older_champion_is_compared_again(
    cfg: PipelineConfig, bundle: Path, tmp_path: Path
) -> None:
    """v1 is champion; a candidate is evaluated against it (and passes); meanwhile another run
    promotes v2, which succeeds every time. The candidate, half as good, must not replace v2."""
    old = register_champion(cfg, bundle, "old", {})
    strong = report(cfg, 10, tmp_path / "v2")
    newer = register_champion(cfg, bundle, "newer", stored_results(cfg, strong))

    weak = report(cfg, 5, tmp_path / "weak")
    result = candidate_registers(cfg, bundle, "weak", weak, compared_with=old)

    assert not result.promoted and result.blocked_by == [NO_REGRESSION]
    assert f"vs v{newer}" in result.gates[NO_REGRESSION].measured
    assert champion_version(cfg) == newer
    assert not (tmp_path / f"champion-v{newer}").exists(), "its stored outcomes were used"
    tags = get_version(cfg.model_name, result.version).tags
    assert tags[GATE_TAG + NO_REGRESSION] == "failed"


def test_a_candidate_as_good_as_the_newer_champion_replaces_it(
    cfg: PipelineConfig, bundle: Path, tmp_path: Path
) -> None:
    old = register_champion(cfg, bundle, "old", {})
    newer = register_champion(
        cfg, bundle, "newer", stored_results(cfg, report(cfg, 6, tmp_path / "v2"))
    )

    result = candidate_registers(cfg, bundle, "good", report(cfg, 10, tmp_path / "good"), old)

    assert result.promoted, result.gates
    assert f"vs v{newer}" in result.gates[NO_REGRESSION].measured
    assert champion_version(cfg) == result.version
    assert champion_history(cfg.model_name)[-2:] == [newer, result.version]
    tags = get_version(cfg.model_name, result.version).tags
    assert tags[PROMOTED_OVER_TAG] == newer
    assert f"vs v{newer}" in json.loads(tags[PROMOTED_ON_TAG])[NO_REGRESSION]


def test_a_moved_champion_is_also_held_against_the_candidate_at_the_devices_delay(
    cfg: PipelineConfig, bundle: Path, tmp_path: Path
) -> None:
    """The latency step played the candidate at its device's delay (an async target: one tick)
    against v1; v2 was promoted meanwhile. Registering plays the delay again against v2, and
    the gate's figure is that one."""
    from stages.evaluate.at_delay import AtDelay, read_at_delay, write_at_delay

    async_target = cfg.latency.model_copy(update={"target": "local-cpu-async"})
    cfg = cfg.model_copy(update={"latency": async_target})
    old = register_champion(cfg, bundle, "old", {})
    stored = stored_results(cfg, report(cfg, 6, tmp_path / "v2"))  # no replay at zero delay
    newer = register_champion(cfg, bundle, "newer", stored)
    folder = tmp_path / "latency"
    folder.mkdir()
    left = AtDelay(  # what the latency step left beside its report, against the old champion
        target="local-cpu-async", mode="async", inference_ms=1.0, margin_ms=20.0,
        period_ms=100.0, ticks=1, why="async, 1 tick", episodes=20, successes=20,
        success_rate=1.0, ci95=(0.8, 1.0), champion=f"v{old}",
    )  # fmt: skip
    write_at_delay(left, folder)

    made = report(cfg, 10, tmp_path / "candidate")
    result = candidate_registers(cfg, bundle, "candidate", made, old, folder)

    again = read_at_delay(folder)
    assert again is not None and again.played and again.champion == f"v{newer}"
    assert again.vs_champion is not None, "played against the champion there is now"
    assert (folder / "at-delay" / f"vs-v{newer}" / "report.md").is_file()
    assert f"v{newer} there" in result.gates[AT_LATENCY].measured


def test_a_champion_without_stored_results_is_evaluated_on_the_same_seeds(
    cfg: PipelineConfig, bundle: Path, tmp_path: Path
) -> None:
    """The newer champion was evaluated on another suite (no stored episodes that fit): it is
    run now, on the candidate's seeds, and the candidate is held to it."""
    old = register_champion(cfg, bundle, "old", {})
    newer = register_champion(cfg, bundle, "newer", {})  # an untrained policy: fails every episode

    result = candidate_registers(cfg, bundle, "lucky", report(cfg, 10, tmp_path / "lucky"), old)

    assert result.promoted
    assert f"vs v{newer}" in result.gates[NO_REGRESSION].measured
    evaluated = tmp_path / f"champion-v{newer}" / "eval_report.json"
    assert evaluated.is_file(), "the champion was evaluated on the candidate's suite"
    champion_run = EvalReport.from_json(json.loads(evaluated.read_text()))
    assert champion_run.seeds == report(cfg, 0, tmp_path / "seeds").seeds


def test_outcomes_stored_under_another_key_are_not_reused(
    cfg: PipelineConfig, bundle: Path, tmp_path: Path
) -> None:
    """Outcomes stored under another key (another simulator, suite or robo-pipe version) are
    ignored: the champion is evaluated again."""
    old = register_champion(cfg, bundle, "old", {})
    tags = stored_results(cfg, report(cfg, 10, tmp_path / "v2"))
    tags[OUTCOMES_KEY_TAG] = "another-simulator-version"
    newer = register_champion(cfg, bundle, "newer", tags)

    result = candidate_registers(cfg, bundle, "lucky", report(cfg, 10, tmp_path / "lucky"), old)

    assert result.promoted and f"vs v{newer}" in result.gates[NO_REGRESSION].measured
    assert (tmp_path / f"champion-v{newer}" / "eval_report.json").is_file(), "evaluated again"


def test_the_outcomes_key_follows_what_decides_an_episode(
    cfg: PipelineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More episodes, workers or looks keep the key (the seeds' episodes are the same); another
    seed, scene, phrasing, simulator version or code version changes it."""
    key = outcomes_key(cfg)
    evaluate = cfg.evaluate.model_copy(update={"episodes": 50, "workers": 3})
    assert outcomes_key(cfg.model_copy(update={"evaluate": evaluate})) == key
    unseen = cfg.evaluate.model_copy(update={"phrasing": "unseen"})
    assert outcomes_key(cfg.model_copy(update={"evaluate": unseen})) != key
    assert outcomes_key(cfg.model_copy(update={"seed": 1})) != key
    tighter = cfg.scene.model_copy(update={"episode_steps": 20})
    assert outcomes_key(cfg.model_copy(update={"scene": tighter})) != key
    monkeypatch.setattr("sim_scenes.backends.simulator_version", lambda sim: "mujoco==0.0.1")
    assert outcomes_key(cfg) != key
    monkeypatch.undo()
    monkeypatch.setattr("stages.provenance.code_version", lambda: "robo-pipe==9.9.9")
    assert outcomes_key(cfg) != key


def _promote_concurrently(home: str, name: str, version: str, barrier: object) -> None:
    os.environ["ROBO_PIPE_HOME"] = home
    from pipelines.services.settings import configure

    configure()
    barrier.wait()  # type: ignore[attr-defined]
    for _ in range(5):
        promote(name, version, f"process {os.getpid()}")


def test_concurrent_promotions_keep_alias_and_history_together(
    cfg: PipelineConfig, bundle: Path, robo_pipe_home: Path
) -> None:
    """Two processes promoting different versions at once: the history's last entry is always
    the version the alias points to (the alias and the history move under one lock)."""
    first = register_champion(cfg, bundle, "one", {})
    second = register_champion(cfg, bundle, "two", {})
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(
            target=_promote_concurrently, args=(str(robo_pipe_home), cfg.model_name, v, barrier)
        )
        for v in (first, second)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    history = champion_history(cfg.model_name)
    assert history[-1] == champion_version(cfg)
    assert sorted(history) == sorted([first, second])


RANDOM_WEIGHTS = ["policy.type=hub-vlm", "policy.preset=tiny", "policy.weights=random"]
"""A hub-vlm policy on the tiny preset with random weights: a systems test."""


def test_a_random_weight_policy_never_becomes_champion(
    cfg: PipelineConfig, bundle: Path, tmp_path: Path
) -> None:
    """Every other gate passes (all wins, as good as the champion, on time): the ``real
    weights`` gate blocks it; ``models promote --force`` refuses it with exit 2 and one line;
    so does the registry itself, whoever calls it."""
    from stages.register.gates import REAL_WEIGHTS
    from tests.pipelines.test_registry import random_weight_bundle

    old = register_champion(cfg, bundle, "old", {})
    systems = load_config(TINY_CONFIG, [*SETS, "registry.model_name=cas-policy", *RANDOM_WEIGHTS])
    random_bundle = random_weight_bundle(bundle, tmp_path / "random-export")

    result = candidate_registers(
        systems, random_bundle, "random", report(systems, 10, tmp_path / "r"), old
    )

    assert not result.promoted and result.blocked_by == [REAL_WEIGHTS]
    assert result.gates[REAL_WEIGHTS].enforced and not result.gates[REAL_WEIGHTS].passed
    assert champion_version(cfg) == old
    tags = get_version(cfg.model_name, result.version).tags
    assert tags[GATE_TAG + REAL_WEIGHTS] == "failed"
    assert tags[RANDOM_WEIGHTS_TAG] == "true"

    version = f"cas-policy/{result.version}"
    forced = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "models", "promote", "--force", version],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert forced.returncode == 2, forced.stdout + forced.stderr
    lines = [line for line in (forced.stdout + forced.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "random weights" in lines[0], lines
    assert "never champion, not even with --force" in lines[0]
    with pytest.raises(RandomWeightsError):
        promote(cfg.model_name, result.version, "a script")
    assert champion_version(cfg) == old
