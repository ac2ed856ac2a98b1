"""The latency gate: a bundle's whole control step measured on this machine, judged against a
target profile (:mod:`deploy_edge.targets`).

The gate warms up, then runs ``steps`` control ticks of the whole loop on this machine and
passes only if p99 <= budget and misses <= allowed; the report says which check failed and what
it measured on.

Mode: ``sync`` (the default) runs :class:`deploy_edge.runtime.ControlLoop`, inference inside the
tick: for a policy whose whole step fits in one period. ``async`` runs
:class:`deploy_edge.async_loop.AsyncControlLoop`, inference off the tick: for one whose inference
takes longer. Its gate first times inference alone (back to back on one observation: inference
p50/p99) and refuses, before running the loop, a chunk that cannot cover inference p99 plus
``inference_margin_ms`` (:func:`deploy_edge.async_loop.async_shortfall`, its arithmetic in the
reason); else it runs the asynchronous loop, paced to the control rate, and judges the tick p99
and misses as above, the action age p99 (observation taken -> action sent) against
``action_age_budget_ms`` and the largest seam jump against ``seam_jump_max``.

A bundle with an instruction graph (``policy.type: pretrained``) encodes its instruction once
per episode, at the episode's first tick: the gate judges the per-tick cost (the policy graph,
the instruction's features cached, as every later tick of an episode runs) and reports the
once-per-episode encoding beside it (``instruction_encode_p50_ms`` / ``_max_ms``: tokenization
and the instruction graph, uncached, :data:`ENCODE_RUNS` times), in ``latency.md``, on the
histogram and in ``latency_report.json``.

Precision: a pinned one runs one thing (:func:`deploy_edge.targets.pinned_option`);
``precision: auto`` (:func:`run_auto_gate`) gates every way the profile's engine can run the
bundle (:func:`deploy_edge.precision.options`) and runs the most accurate one that meets the
budget (:func:`deploy_edge.precision.choose_variant`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.async_loop import AsyncControlLoop
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.exported import ExportedPolicy
from deploy_edge.latency_report import LatencyReport, write_report, write_with_histogram
from deploy_edge.precision import (
    Option,
    accuracy_rank,
    choose_variant,
    options,
    trial_error,
)
from deploy_edge.runtime import ControlLoop, Tick, measure_inference
from deploy_edge.targets import (
    TargetError,
    TargetProfile,
    check_robot,
    control_rate,
    pinned_option,
    rate_note,
)
from deploy_edge.wire import Trial
from robo_pipe.errors import RoboPipeError
from robots.interface import Robot


def verdict(ms: np.ndarray, misses: int, budget_ms: float, allowed_misses: int) -> dict[str, Any]:
    """The gate's rule on measured step latencies ``ms`` (one per tick, milliseconds): pass
    only if p99 <= ``budget_ms`` and ``misses`` <= ``allowed_misses``. Returns the
    :class:`LatencyReport` fields it decides: ``passed``, ``reasons`` (why it failed),
    percentiles (numpy's linear interpolation), max, mean, jitter (std) and misses."""
    p99 = float(np.percentile(ms, 99))
    reasons = []
    if p99 > budget_ms:
        reasons.append(f"p99 {p99:.2f} ms > budget {budget_ms:g} ms")
    if misses > allowed_misses:
        reasons.append(f"{misses} deadline misses > {allowed_misses} allowed")
    return {
        "passed": not reasons,
        "reasons": reasons,
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "p99_ms": p99,
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        "jitter_ms": float(ms.std()),
        "misses": misses,
    }


INFERENCE_RUNS = 10
"""Inferences :func:`target_loop` times, when not told the inference time, in ``async`` mode."""
ENCODE_RUNS = 10
"""Instruction encodings the gate times (a bundle with an instruction graph)."""


def target_loop(
    policy: ExportedPolicy,
    robot: Robot,
    instruction: str,
    target: TargetProfile,
    pace: bool,
    inference_s: float | None = None,
) -> ControlLoop | AsyncControlLoop:
    """The control loop as ``target`` runs it, on a connected ``robot``: its mode, the policy's
    rate (:func:`~deploy_edge.targets.control_rate`: the bundle's unless the profile sets a
    what-if; one period is a tick's deadline), and in ``sync`` the actions executed per
    inferred chunk, in ``async`` the trigger threshold from ``inference_s`` (p99, s; None:
    timed here on :data:`INFERENCE_RUNS` inferences) plus the margin, and the blend. ``async``
    is always paced: its ticks stand for periods only then. Close it when done.

    Raises:
        RobotMismatch: ``robot`` is not the bundle's, or runs at another rate (before any tick).
        TargetError: ``async`` with a chunk that cannot cover inference (the arithmetic).
    """
    check_robot(policy.spec, robot.spec.name, robot.spec.control_hz)
    deadline_s = 1.0 / control_rate(policy.spec, target)
    if target.mode == "sync":
        return ControlLoop(
            policy,
            robot,
            instruction,
            execute=min(target.execute, policy.chunk_len),
            deadline_s=deadline_s,
            pace=pace,
        )
    if inference_s is None:
        measured = measure_inference(policy, robot, instruction, INFERENCE_RUNS)
        inference_s = float(np.percentile(measured, 99))
    try:
        return AsyncControlLoop(
            policy,
            robot,
            instruction,
            inference_s=inference_s,
            margin_s=target.inference_margin_ms / 1000.0,
            blend=target.blend,
            deadline_s=deadline_s,
            pace=True,
        )
    except ValueError as err:
        raise TargetError(f"target {target.name!r}: {err}") from err


def open_policy(
    export_dir: str | Path, target: TargetProfile, option: Option | None = None
) -> ExportedPolicy:
    """The bundle on ``target``'s engine as ``option`` says (default: the pinned precision's
    :func:`pinned_option`)."""
    if option is None:
        option = pinned_option(read_io_spec(export_dir), target)
    return ExportedPolicy(
        export_dir,
        target.engine,
        option.precision,
        target.threads,
        variant=option.variant,
        added_ms=target.added_inference_ms,
    )


def run_gate(
    export_dir: str | Path,
    robot: Robot,
    instruction: str,
    target: TargetProfile,
    steps: int = 1000,
    warmup: int = 50,
    budget_ms: float | None = None,
    pace: bool = True,
    out: Path | None = None,
    policy: ExportedPolicy | None = None,
) -> LatencyReport:
    """Measure the whole control step of ``export_dir`` on ``robot`` and gate it (a pinned
    precision, or ``policy`` as given; ``precision: auto`` is :func:`run_auto_gate`)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if policy is None and target.chooser is not None:
        raise TargetError(f"target {target.name!r} says precision: auto: use run_auto_gate")
    policy = policy or open_policy(export_dir, target)
    budget = budget_ms if budget_ms is not None else target.budget_ms
    # Another robot, or one of another rate, is refused before it is connected (target_loop
    # checks it too).
    check_robot(policy.spec, robot.spec.name, robot.spec.control_hz)
    hz = control_rate(policy.spec, target)
    rate: dict[str, Any] = {
        "control_hz": hz,
        "deadline_ms": 1000.0 / hz,
        "rate_note": rate_note(policy.spec, target),
    }
    inference_ms: np.ndarray | None = None
    robot.connect()
    try:
        # Once per episode, not per tick: timed apart, reported beside the tick figures.
        encode = _encode_figures(policy.time_instruction_encoding(instruction, ENCODE_RUNS))
        if target.mode == "async":  # inference alone first: the loop's threshold, or a refusal
            inference_ms = measure_inference(policy, robot, instruction, max(warmup, 5)) * 1e3
        p99_s = None if inference_ms is None else float(np.percentile(inference_ms, 99)) / 1e3
        try:
            loop = target_loop(policy, robot, instruction, target, pace, p99_s)
        except TargetError as err:  # the chunk cannot cover inference: refused before running
            assert inference_ms is not None
            refused = LatencyReport(
                export=str(export_dir),
                target=target.name,
                passed=False,
                reasons=[str(err)],
                budget_ms=budget,
                allowed_misses=target.allowed_misses,
                steps=0,
                warmup=0,
                p50_ms=0.0,
                p95_ms=0.0,
                p99_ms=0.0,
                max_ms=0.0,
                mean_ms=0.0,
                jitter_ms=0.0,
                misses=0,
                errors=0,
                inference_ticks=0,
                measured_on=policy.engine.describe(),
                variant=policy.variant,
                mode=target.mode,
                **_inference_figures(inference_ms),
                **encode,
                **rate,
            )
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                write_report(refused, out, None)
            return refused
        try:
            loop.run(warmup)
            ticks: list[Tick] = loop.run(steps)
        finally:
            loop.close()
    finally:
        robot.stop()
    ms = np.array([t.latency_s for t in ticks]) * 1000.0
    misses = sum(t.missed for t in ticks)
    figures = verdict(ms, misses, budget, target.allowed_misses)
    unsafe = [t.refused for t in ticks if t.refused]
    if unsafe:  # a policy that emits NaN, inf or a wild action fails whatever misses it allows
        figures["reasons"].append(
            f"{len(unsafe)} ticks refused an unsafe value (first: {unsafe[0]})"
        )
        figures["passed"] = False
    extra: dict[str, Any] = {}
    if inference_ms is not None:
        extra = _async_figures(ticks, target) | _inference_figures(inference_ms)
        figures["reasons"] += extra.pop("reasons")
        figures["passed"] = not figures["reasons"]
    report = LatencyReport(
        export=str(export_dir),
        target=target.name,
        budget_ms=budget,
        allowed_misses=target.allowed_misses,
        steps=steps,
        warmup=warmup,
        errors=sum(bool(t.error) for t in ticks),
        inference_ticks=sum(t.inferred for t in ticks),
        measured_on=policy.engine.describe(),
        variant=policy.variant,
        mode=target.mode,
        **figures,
        **extra,
        **encode,
        **rate,
    )
    if out is not None:
        write_with_histogram(report, ms, out)
    return report


def _encode_figures(seconds: np.ndarray) -> dict[str, Any]:
    """The report's instruction-encoding figures from the timed encodings (none: None)."""
    if not seconds.size:
        return {"instruction_encode_p50_ms": None, "instruction_encode_max_ms": None}
    return {
        "instruction_encode_p50_ms": float(np.percentile(seconds, 50)) * 1e3,
        "instruction_encode_max_ms": float(seconds.max()) * 1e3,
    }


def _inference_figures(inference_ms: np.ndarray) -> dict[str, Any]:
    return {
        "inference_p50_ms": float(np.percentile(inference_ms, 50)),
        "inference_p99_ms": float(np.percentile(inference_ms, 99)),
    }


def _async_figures(ticks: list[Tick], target: TargetProfile) -> dict[str, Any]:
    """The asynchronous loop's own figures over ``ticks`` and the reasons they fail
    ``target``: action age p50/p99 (ms, ticks that sent a policy action) against
    ``action_age_budget_ms``, the largest seam jump (robot units) against ``seam_jump_max``."""
    ages = np.array([t.action_age_s for t in ticks if t.action_age_s is not None]) * 1e3
    seams = [t.seam_jump for t in ticks if t.seam_jump is not None]
    age_p99 = float(np.percentile(ages, 99)) if ages.size else None
    seam = max(seams) if seams else None
    reasons = []
    budget = target.action_age_budget_ms
    if budget is not None and age_p99 is not None and age_p99 > budget:
        reasons.append(f"action age p99 {age_p99:.2f} ms > budget {budget:g} ms")
    if target.seam_jump_max is not None and seam is not None and seam > target.seam_jump_max:
        reasons.append(
            f"largest seam jump {seam:.4g} > {target.seam_jump_max:g} (robot units, "
            f"blend: {target.blend})"
        )
    return {
        "reasons": reasons,
        "action_age_p50_ms": float(np.percentile(ages, 50)) if ages.size else None,
        "action_age_p99_ms": age_p99,
        "seam_jump_max": seam,
    }


def gate_trial(trial: Trial, report: LatencyReport) -> None:
    """Record ``report``'s figures on ``trial``; a gate that failed for anything but its p99
    (deadline misses) puts the trial out, its reasons naming the p99 against the budget too
    when that failed as well (a refusal names each option's p99). A p99 alone over the budget
    is the choice's to judge."""
    trial.p99_ms, trial.misses = report.p99_ms, report.misses
    if any(not r.startswith("p99 ") for r in report.reasons):
        trial.failure = "gate: " + "; ".join(report.reasons)
    if report.errors:
        trial.failure = trial.failure or f"gate: {report.errors} engine errors"


def run_auto_gate(
    export_dir: str | Path,
    robot: Callable[[], Robot],
    instruction: str,
    target: TargetProfile,
    steps: int = 1000,
    warmup: int = 50,
    budget_ms: float | None = None,
    pace: bool = True,
    out: Path | None = None,
) -> LatencyReport:
    """``precision: auto`` on this machine: every way ``target``'s engine can run the bundle
    (:func:`options`) built and gated on a fresh ``robot()`` each, then
    :func:`choose_variant`. The report is the chosen one's figures with every trial and the
    choice; none fits: the most accurate measured one's figures, failed, the reason naming
    each trial's p99 against the budget."""
    spec = read_io_spec(export_dir)
    budget = budget_ms if budget_ms is not None else target.budget_ms
    tried, out_of_it = options(spec, target.engine)
    trials: list[Trial] = []
    measured: dict[str, LatencyReport] = {}
    for option in tried:
        trial = Trial(option.name, option.precision, trial_error(option, spec))
        trials.append(trial)
        try:
            policy = open_policy(export_dir, target, option)
        except (RoboPipeError, OSError) as err:  # EngineUnavailable, EngineError, IOSpecError
            trial.failure = f"engine: {err}"
            continue
        here = out / option.name if out is not None else None
        report = run_gate(
            export_dir, robot(), instruction, target, steps, warmup, budget, pace, here, policy
        )
        gate_trial(trial, report)
        measured[option.name] = report
    choice = choose_variant(trials + out_of_it, budget)
    if choice.chosen is not None:
        report = measured[choice.chosen.variant]
    elif measured:
        best = min((t for t in choice.trials if t.variant in measured), key=accuracy_rank)
        report = measured[best.variant]
        report.passed, report.reasons = False, [choice.reason]
    else:
        raise TargetError(f"target {target.name!r}: {choice.reason}")
    report.trials, report.choice = choice.trials, choice.reason
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        report.histogram = str(out / report.variant / "latency.png")
        write_report(report, out, f"{report.variant}/latency.png")
    return report
