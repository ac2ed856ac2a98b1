"""``precision: auto``: the choice rule on recorded figures (the most accurate candidate within
the budget; none fits: refused with each one's p99 against the budget; a non-candidate or a
failed one never), the rule broken on purpose caught by the same checks, what each engine
tries, pinned precisions, a variant run by ONNX Runtime, and the pipeline's own auto gate on a
bundle with an INT8 variant and a non-candidate."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from deploy_edge.bundle.io_spec import IOSpecError, read_io_spec
from deploy_edge.bundle.layout import REFERENCE_FILE
from deploy_edge.engines import EngineUnavailable
from deploy_edge.exported import ExportedPolicy
from deploy_edge.latency import gate_trial, run_auto_gate
from deploy_edge.precision import Choice, choose_variant, options
from deploy_edge.targets import TargetError, load_target, pinned_option
from deploy_edge.wire import Trial
from robots.spec import get_robot
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import get_variant
from tests.deploy_edge.variants import with_variants

Rule = Callable[[list[Trial], float], Choice]


def recorded() -> list[Trial]:
    """Figures as a device measures them: FP32 exact but slow, INT8 2% off and fast, an FP8
    variant 4% off and fastest, one that failed parity, and a non-candidate that would be the
    most accurate and fastest of all if it were allowed."""
    return [
        Trial("fp32", "fp32", 0.0, p99_ms=180.0),
        Trial("int8", "int8", 0.02, p99_ms=60.0),
        Trial("fp8", "fp8", 0.04, p99_ms=40.0),
        Trial("int8-broken", "int8", 0.01, failure="parity: max |error| 3e-01 > 1e-03", p99_ms=5.0),
        Trial("int4", "int8", 0.0, candidate=False, failure="not a candidate: 9% > 5%", p99_ms=1.0),
    ]


def check_rule(rule: Rule) -> None:
    """What the rule must do on recorded figures (an AssertionError says what it broke)."""
    at_100 = rule(recorded(), 100.0)
    assert at_100.chosen is not None and at_100.chosen.variant == "int8", at_100.reason
    marked = {t.variant: t for t in at_100.trials}
    assert [t.variant for t in at_100.trials if t.chosen] == ["int8"]
    assert marked["fp32"].failure == "p99 180.00 ms > budget 100 ms"
    assert marked["fp8"].failure.startswith("less accurate than int8 (4.00% vs 2.00%)")
    assert marked["int4"].failure.startswith("not a candidate")
    assert marked["int8-broken"].failure.startswith("parity:")

    at_200 = rule(recorded(), 200.0)
    assert at_200.chosen is not None and at_200.chosen.variant == "fp32", "exact, and it fits"
    at_50 = rule(recorded(), 50.0)
    assert at_50.chosen is not None and at_50.chosen.variant == "fp8", "the only one that fits"

    none = rule(recorded(), 2.0)
    assert none.chosen is None and not any(t.chosen for t in none.trials)
    assert none.reason.startswith("no candidate meets the budget 2 ms (")
    for name, p99 in (("fp32", 180.0), ("int8", 60.0), ("fp8", 40.0)):
        assert f"{name}: p99 {p99:.2f} ms > budget 2 ms" in none.reason, none.reason
    assert "int4: not a candidate" in none.reason and "int8-broken: parity:" in none.reason

    tie = [
        Trial("int8", "int8", 0.01, p99_ms=10.0),
        Trial("fp16", "fp16", 0.01, p99_ms=20.0),
        Trial("trt-fp16", "fp16", None, p99_ms=5.0),
    ]
    chosen = rule(tie, 100.0).chosen
    assert chosen is not None and chosen.variant == "fp16", "a tie goes to the finer precision"
    assert rule(tie[2:], 100.0).chosen is not None, "an unscored one runs when it is alone"


def test_the_rule_picks_the_most_accurate_candidate_within_the_budget() -> None:
    check_rule(choose_variant)
    trials = recorded()
    choose_variant(trials, 100.0)
    assert not any(t.chosen for t in trials), "the caller's trials are not changed"


def test_a_trial_out_for_misses_still_names_its_p99_against_the_budget() -> None:
    """A 256M preset on this CPU misses every tick *and* its p99 is over the budget: the
    refusal must still say how far over (the arithmetic a user needs), not only the misses."""
    from deploy_edge.latency import verdict
    from deploy_edge.latency_report import LatencyReport

    slow = Trial("fp32", "fp32", 0.0)
    figures = verdict(np.array([1300.0, 1340.0]), misses=2, budget_ms=100.0, allowed_misses=0)
    gate_trial(slow, LatencyReport("e", "t", budget_ms=100.0, allowed_misses=0, steps=2,
                                   warmup=0, errors=0, inference_ticks=2, **figures))  # fmt: skip
    refused = choose_variant([slow], 100.0)
    assert refused.chosen is None and "fp32: gate: p99 1339.60 ms > budget 100 ms" in refused.reason
    assert "2 deadline misses > 0 allowed" in refused.reason
    on_time = Trial("int8", "int8", 0.02)
    within = verdict(np.array([50.0, 60.0]), misses=0, budget_ms=100.0, allowed_misses=0)
    gate_trial(on_time, LatencyReport("e", "t", budget_ms=100.0, allowed_misses=0, steps=2,
                                      warmup=0, errors=0, inference_ticks=2, **within))  # fmt: skip
    chosen = choose_variant([slow, on_time], 100.0).chosen
    assert not on_time.failure and chosen is not None and chosen.variant == "int8"


def _least_accurate(trials: list[Trial], budget_ms: float) -> Choice:
    fitting = [t for t in trials if t.fits(budget_ms)]
    worst = max(fitting, key=lambda t: t.relative_error or 0.0, default=None)
    return Choice(worst, trials, "mutant")


def _fastest(trials: list[Trial], budget_ms: float) -> Choice:
    fitting = [t for t in trials if t.fits(budget_ms)]
    return Choice(min(fitting, key=lambda t: t.p99_ms or 0.0, default=None), trials, "mutant")


def _ignores_candidate(trials: list[Trial], budget_ms: float) -> Choice:
    allowed = [Trial(**{**t.__dict__, "candidate": True, "failure": ""}) for t in trials]
    return choose_variant(allowed, budget_ms)


def _ignores_budget(trials: list[Trial], budget_ms: float) -> Choice:
    return choose_variant(trials, float("inf"))


@pytest.mark.parametrize(
    "mutant",
    [_least_accurate, _fastest, _ignores_candidate, _ignores_budget],
    ids=lambda rule: rule.__name__,
)
def test_a_broken_rule_fails_the_checks(mutant: Rule) -> None:
    """The rule broken on purpose (least accurate, fastest, non-candidates allowed, budget
    ignored): the same checks fail."""
    with pytest.raises(AssertionError):
        check_rule(mutant)


@pytest.fixture(scope="module")
def variants_dir(export_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny export with an INT8 variant (ONNX Runtime's static Q/DQ quantisation) and a
    non-candidate past its error bar."""
    return with_variants(
        export_dir,
        tmp_path_factory.mktemp("variants") / "bundle",
        {"name": "int8", "relative_error": 0.02},
        {"name": "int8-wide", "file": "copy", "relative_error": 0.09, "candidate": False,
         "reason": "relative error 9.00% > 5.00%"},
    )  # fmt: skip


def test_each_engine_tries_the_fp32_model_and_the_candidates_it_runs(variants_dir: Path) -> None:
    spec = read_io_spec(variants_dir)
    tried, out = options(spec, "onnxruntime")
    assert [(o.name, o.precision, o.variant) for o in tried] == [
        ("fp32", "fp32", None),
        ("int8", "int8", "int8"),
    ]
    assert [(t.variant, t.candidate, t.failure) for t in out] == [
        ("int8-wide", False, "not a candidate: relative error 9.00% > 5.00%")
    ]
    tried, _ = options(spec, "tensorrt")
    assert [o.name for o in tried] == ["fp32", "fp16", "int8"], "TensorRT adds its FP16 build"


def test_a_pinned_precision_runs_its_variant_or_says_why_it_cannot(variants_dir: Path) -> None:
    spec = read_io_spec(variants_dir)
    cpu = load_target("local-cpu")
    assert pinned_option(spec, cpu).variant is None
    int8 = cpu.model_copy(update={"name": "cpu-int8", "precision": "int8"})
    assert pinned_option(spec, int8).variant == "int8"
    fp8 = cpu.model_copy(update={"name": "cpu-fp8", "precision": "fp8"})
    with pytest.raises(TargetError, match=r"pins precision fp8, but it has no fp8 variant"):
        pinned_option(spec, fp8)
    only_bad = spec.__class__(**{**spec.__dict__, "variants": spec.variants[1:]})
    with pytest.raises(TargetError, match=r"int8 variant is not a candidate \(relative error"):
        pinned_option(only_bad, int8)


def test_onnxruntime_runs_the_int8_variant_within_its_recorded_reference_error(
    variants_dir: Path,
) -> None:
    policy = ExportedPolicy(variants_dir, variant="int8")
    assert policy.variant == "int8" and policy.engine.precision == "int8"
    assert policy.engine.describe()["precision"] == "int8"
    reference = dict(np.load(variants_dir / REFERENCE_FILE))
    got = policy.engine.run({n: reference[n] for n in policy.engine.input_names})["actions"]
    error = float(np.abs(got - reference["expected_actions"]).max())
    recorded = read_io_spec(variants_dir).variant("int8")
    assert recorded is not None and error == pytest.approx(recorded.reference_error, abs=1e-5)
    fp32 = ExportedPolicy(variants_dir)
    assert fp32.variant == "fp32" and not np.allclose(
        fp32.engine.run({n: reference[n] for n in fp32.engine.input_names})["actions"], got
    ), "a different graph ran"
    with pytest.raises(IOSpecError, match=r"no precision variant 'fp8' \(variants: int8, "):
        ExportedPolicy(variants_dir, variant="fp8")


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here"
)
def test_tensorrt_variants_say_they_need_tensorrt(variants_dir: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"TensorRT is not available here"):
        ExportedPolicy(variants_dir, engine="tensorrt", variant="int8")


def _robot(spec_dir: Path) -> Callable[[], SimulatedRobot]:
    spec = read_io_spec(spec_dir)
    return lambda: SimulatedRobot(
        get_robot("rp5"), get_variant("touch-mixed"), 0, spec.cameras, spec.image_size
    )


def test_the_auto_gate_runs_the_most_accurate_that_fits_and_says_why_not_the_others(
    variants_dir: Path, tmp_path: Path
) -> None:
    auto = load_target("local-cpu-auto")
    assert auto.precision == "auto" and auto.engine == "onnxruntime"
    robot = _robot(variants_dir)
    report = run_auto_gate(variants_dir, robot, "touch the red cube", auto, 20, 3, None, False,
                           tmp_path)  # fmt: skip
    assert report.passed and report.variant == "fp32", report.choice
    assert report.choice.startswith("fp32: the most accurate candidate within 100 ms")
    trials = {t.variant: t for t in report.trials}
    assert trials["fp32"].chosen and trials["int8"].p99_ms is not None
    assert trials["int8"].failure == "less accurate than fp32 (2.00% vs 0.00%)"
    assert trials["int8-wide"].p99_ms is None, "a non-candidate is never run"
    assert "precision: auto" in (tmp_path / "latency.md").read_text()
    assert (tmp_path / "fp32" / "latency.png").is_file()

    refused = run_auto_gate(variants_dir, robot, "touch the red cube", auto, 20, 3, 0.0001,
                            False)  # fmt: skip
    assert not refused.passed and refused.variant == "fp32"
    (reason,) = refused.reasons
    assert reason.startswith("no candidate meets the budget 0.0001 ms (fp32: p99 ")
    assert "; int8: p99 " in reason and "> budget 0.0001 ms" in reason
    assert "int8-wide: not a candidate" in reason
