"""Target profiles and the latency gate.

A target profile (``configs/targets/<name>.yaml``, package data of :mod:`configs`) says how a
policy runs on one kind of machine: engine, precision, control rate, the latency budget at p99
and the deadline misses allowed, and the mode the loop runs in. The gate warms up, then runs
``steps`` control ticks of the whole loop on this machine and passes only if p99 <= budget and
misses <= allowed; the report says which check failed and what it measured on.

Mode: ``sync`` (the default) runs :class:`deploy_edge.runtime.ControlLoop`, inference inside the
tick: for a policy whose whole step fits in one period. ``async`` runs
:class:`deploy_edge.runtime.AsyncControlLoop`, inference off the tick: for one whose inference
takes longer. Its gate first times inference alone (back to back on one observation: inference
p50/p99) and refuses, before running the loop, a chunk that cannot cover inference p99 plus
``inference_margin_ms`` (:func:`deploy_edge.runtime.async_shortfall`, its arithmetic in the
reason); else it runs the asynchronous loop, paced to the control rate, and judges the tick p99
and misses as above, the action age p99 (observation taken -> action sent) against
``action_age_budget_ms`` and the largest seam jump against ``seam_jump_max``.

A bundle with an instruction graph (``policy.type: pretrained``) encodes its instruction once
per episode, at the episode's first tick: the gate judges the per-tick cost (the policy graph,
the instruction's features cached, as every later tick of an episode runs) and reports the
once-per-episode encoding beside it (``instruction_encode_p50_ms`` / ``_max_ms``: tokenization
and the instruction graph, uncached, :data:`ENCODE_RUNS` times), in ``latency.md``, on the
histogram and in ``latency_report.json``.

Precision: pinned (``fp32``, ``fp16``, ``int8``, ``fp8``) runs one thing: ``fp32`` and ``fp16``
the bundle's FP32 model (ONNX Runtime runs it in FP32; TensorRT builds it in FP16 with the
builder flag), ``int8`` and ``fp8`` the bundle's candidate variant of that precision (its
explicit Q/DQ graph). ``auto`` tries every way the profile's engine can run the bundle
(:func:`options`: the FP32 model, TensorRT's FP16 build of it, every candidate variant), gates
each, and runs the most accurate one that meets the budget (:func:`choose_variant`). A variant
the export did not make a candidate (past its error bar, worse on success) is listed with its
reason and never run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from configs import targets_dir
from deploy_edge.bundle.io_spec import PRECISIONS, IOSpec, read_io_spec
from deploy_edge.exported import ExportedPolicy
from deploy_edge.runtime import AsyncControlLoop, Blend, ControlLoop, Tick, measure_inference
from deploy_edge.wire import Trial
from robo_pipe.errors import RoboPipeError
from robo_pipe.records import Record
from robo_pipe.validation import first_error
from robots.interface import Robot

TARGETS_DIR = targets_dir()
"""The shipped target profiles (package data of :mod:`configs`)."""


class TargetError(RoboPipeError, ValueError):
    """An unknown target name, or a target profile that is not valid (the message names the
    file, field and value)."""


class TargetProfile(BaseModel):
    """How a policy runs on one kind of machine."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    description: str = ""
    engine: Literal["onnxruntime", "tensorrt"] = "onnxruntime"
    """Inference engine (TensorRT builds its engine on the target)."""
    precision: Literal["fp32", "fp16", "int8", "fp8", "auto"] = "fp32"
    """Pinned (see the module docstring), or ``auto``: the most accurate way to run the bundle
    that meets the budget on this machine."""
    threads: int = Field(default=1, ge=1, le=256)
    """CPU threads for the engine."""
    control_hz: float = Field(default=10.0, gt=0, le=1000)
    """Control rate; a tick's deadline is one period."""
    budget_ms: float = Field(default=100.0, gt=0)
    """p99 latency budget of the whole control step."""
    allowed_misses: int = Field(default=0, ge=0)
    """Deadline misses tolerated over the measured steps."""
    execute: int = Field(default=1, ge=1)
    """``sync``: actions of each chunk executed before inferring again."""
    mode: Literal["sync", "async"] = "sync"
    """``sync``: inference inside the control tick; ``async``: off it, the tick taking planned
    actions (module docstring)."""
    inference_margin_ms: float = Field(default=20.0, ge=0)
    """``async``: added to the measured inference p99 for the trigger threshold and the chunk
    check (the queue's copy, scheduling, a network hop)."""
    action_age_budget_ms: float | None = Field(default=None, gt=0)
    """``async`` (required there): p99 budget of an action's age, its observation taken -> it
    is sent."""
    seam_jump_max: float | None = Field(default=None, gt=0)
    """``async``: the largest step of the planned target allowed where a new chunk takes over
    (:attr:`deploy_edge.runtime.Tick.seam_jump`; rad of joint position, m of gripper opening;
    None: measured, not judged)."""
    blend: Blend = "linear"
    """``async``: how a new chunk joins the planned actions
    (:class:`~deploy_edge.runtime.ChunkQueue`)."""

    @model_validator(mode="after")
    def _async_has_an_age_budget(self) -> TargetProfile:
        if self.mode == "async" and self.action_age_budget_ms is None:
            raise ValueError(
                "mode: async needs action_age_budget_ms (the p99 budget of observation -> "
                "action sent)"
            )
        return self


ENGINE_RUNS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("fp32", "fp16", "int8"),
    "tensorrt": ("fp32", "fp16", "int8", "fp8"),
}
"""Precisions of variant files each engine runs: ONNX Runtime any variant but FP8 (its CPU
kernels have no FP8 Q/DQ), TensorRT every one (FP8 only on SM 8.9+, which it says when
building)."""


@dataclass(frozen=True)
class Option:
    """One way to run a bundle: its name (:attr:`~deploy_edge.wire.Trial.variant`), precision,
    and the bundle variant whose file runs (None: the FP32 model)."""

    name: str
    precision: str
    variant: str | None


def options(spec: IOSpec, engine: str) -> tuple[list[Option], list[Trial]]:
    """What ``precision: auto`` tries on ``engine``: the FP32 model (and, on TensorRT, its FP16
    build), then every candidate variant the engine runs; and a trial that is already out
    (with its reason) for every variant that is not a candidate or that the engine cannot
    run."""
    runs = ENGINE_RUNS.get(engine, ("fp32",))
    tried = [Option("fp32", "fp32", None)]
    if engine == "tensorrt" and spec.variant("fp16") is None:
        tried.append(Option("fp16", "fp16", None))
    out: list[Trial] = []
    for v in spec.variants:
        if not v.candidate:
            why = f"not a candidate: {v.reason or 'the export did not make it one'}"
            out.append(Trial(v.name, v.precision, v.relative_error, False, why))
        elif v.precision not in runs:
            why = f"{engine} does not run {v.precision} variants"
            out.append(Trial(v.name, v.precision, v.relative_error, True, why))
        else:
            tried.append(Option(v.name, v.precision, v.name))
    return tried, out


def pinned_option(spec: IOSpec, target: TargetProfile) -> Option:
    """What a pinned precision runs: ``fp32``/``fp16`` the FP32 model, ``int8``/``fp8`` the
    bundle's candidate variant of that precision (:class:`TargetError` if it has none)."""
    precision = target.precision
    if precision in ("fp32", "fp16"):
        return Option(precision, precision, None)
    found = [v for v in spec.variants if v.precision == precision]
    usable = [v for v in found if v.candidate]
    if not usable:
        why = (
            f"its {precision} variant is not a candidate ({found[0].reason})"
            if found
            else f"it has no {precision} variant (variants: "
            f"{', '.join(v.name for v in spec.variants) or 'none'})"
        )
        raise TargetError(f"target {target.name!r} pins precision {precision}, but {why}")
    return Option(usable[0].name, precision, usable[0].name)


def trial_error(option: Option, spec: IOSpec) -> float | None:
    """The option's recorded error relative to the action std (0 for the FP32 model, None for
    TensorRT's FP16 build of it, which the export did not score)."""
    if option.variant is None:
        return 0.0 if option.precision == "fp32" else None
    variant = spec.variant(option.variant)
    return variant.relative_error if variant is not None else None


def accuracy_rank(trial: Trial) -> tuple[float, int]:
    """Sort key, most accurate first: the smaller recorded error relative to the action std
    (an unscored one after every scored one), ties by :data:`PRECISIONS` order."""
    error = trial.relative_error if trial.relative_error is not None else float("inf")
    precision = PRECISIONS.index(trial.precision) if trial.precision in PRECISIONS else 99
    return (error, precision)


@dataclass
class Choice:
    """What :func:`choose_variant` decided: the trial that runs (None: none fits), every trial
    marked (``chosen``; why not in ``failure``), and one line saying why."""

    chosen: Trial | None
    trials: list[Trial]
    reason: str


def choose_variant(trials: list[Trial], budget_ms: float) -> Choice:
    """The rule of ``precision: auto``: of the trials that are candidates, built, within their
    parity and gate (no ``failure``) and whose p99 <= ``budget_ms``, the most accurate
    (:func:`accuracy_rank`). A non-candidate is never chosen. None fits: no choice, and the
    reason names each trial's p99 against the budget (or why it was out). The trials come back
    as copies, each marked: chosen, or why not (``failure``)."""
    marked = [dataclasses.replace(t) for t in trials]
    fitting = sorted((t for t in marked if t.fits(budget_ms)), key=accuracy_rank)
    for t in marked:
        t.chosen = False
        if not t.failure and t.p99_ms is not None and t.p99_ms > budget_ms:
            t.failure = f"p99 {t.p99_ms:.2f} ms > budget {budget_ms:g} ms"
    if not fitting:
        each = "; ".join(f"{t.variant}: {t.failure or 'not measured'}" for t in marked)
        return Choice(None, marked, f"no candidate meets the budget {budget_ms:g} ms ({each})")
    best = fitting[0]
    best.chosen = True
    for t in fitting[1:]:
        t.failure = f"less accurate than {best.variant} ({_error(t)} vs {_error(best)})"
    return Choice(
        best,
        marked,
        f"{best.variant}: the most accurate candidate within {budget_ms:g} ms "
        f"(p99 {best.p99_ms:.2f} ms, error {_error(best)} of the action std)",
    )


def _error(trial: Trial) -> str:
    return "unscored" if trial.relative_error is None else f"{trial.relative_error:.2%}"


def available_targets() -> list[str]:
    """Profiles shipped in ``configs/targets``."""
    return sorted(p.stem for p in TARGETS_DIR.glob("*.yaml"))


def load_target(name_or_path: str) -> TargetProfile:
    """A profile by name (``configs/targets/<name>.yaml``) or path; errors name file and field."""
    path = Path(name_or_path)
    if not path.is_file():
        path = TARGETS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise TargetError(
            f"unknown target {name_or_path!r}; valid choices: {', '.join(available_targets())}"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise TargetError(f"{path}: not valid YAML: {err}") from err
    try:
        return TargetProfile.model_validate(data)
    except ValidationError as err:
        raise TargetError(first_error(path, err)) from err


@dataclass
class LatencyReport(Record):
    """The gate's result (a record: ``to_json`` / ``from_json``)."""

    export: str
    target: str
    passed: bool
    reasons: list[str]
    """Why it failed (empty when it passed)."""
    budget_ms: float
    allowed_misses: int
    steps: int
    warmup: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    jitter_ms: float
    """Standard deviation of the step latency."""
    misses: int
    errors: int
    inference_ticks: int
    measured_on: dict[str, str] = field(default_factory=dict)
    """Engine, precision, hardware and software versions."""
    report: str = ""
    histogram: str = ""
    variant: str = ""
    """What of the bundle was measured (:attr:`~deploy_edge.wire.Trial.variant`): the pinned
    one, or the one ``precision: auto`` chose (the figures above are its)."""
    trials: list[Trial] = field(default_factory=list)
    """With ``precision: auto``: every way the bundle could run, its p99, and why it was or was
    not chosen; empty for a pinned precision."""
    choice: str = ""
    """With ``precision: auto``: why :attr:`variant` runs, or why none does."""
    mode: str = "sync"
    """The loop measured: ``sync`` or ``async`` (the figures below are ``async``'s; None in
    ``sync``)."""
    inference_p50_ms: float | None = None
    """Inference alone, back to back before the loop ran."""
    inference_p99_ms: float | None = None
    action_age_p50_ms: float | None = None
    """Observation taken -> action sent, over the ticks that sent a policy action."""
    action_age_p99_ms: float | None = None
    seam_jump_max: float | None = None
    """The largest change of any action dimension where a new chunk took over, robot units
    (None: no seam in the measured ticks)."""
    instruction_encode_p50_ms: float | None = None
    """A bundle with an instruction graph: encoding one instruction (tokenization and the
    instruction graph), the once-per-episode cost not in the tick figures, p50; None: the
    policy graph takes the tokens every tick."""
    instruction_encode_max_ms: float | None = None
    """The same, the slowest of the runs."""


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
    """The control loop as ``target`` runs it, on a connected ``robot``: its mode, its rate (one
    period is a tick's deadline), and in ``sync`` the actions executed per inferred chunk, in
    ``async`` the trigger threshold from ``inference_s`` (p99, s; None: timed here on
    :data:`INFERENCE_RUNS` inferences) plus the margin, and the blend. ``async`` is always
    paced: its ticks stand for periods only then. Close it when done.

    Raises:
        TargetError: ``async`` with a chunk that cannot cover inference (the arithmetic).
    """
    deadline_s = 1.0 / target.control_hz
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
        export_dir, target.engine, option.precision, target.threads, variant=option.variant
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
    if policy is None and target.precision == "auto":
        raise TargetError(f"target {target.name!r} says precision: auto: use run_auto_gate")
    policy = policy or open_policy(export_dir, target)
    budget = budget_ms if budget_ms is not None else target.budget_ms
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
            )
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                _write_report(refused, out, None)
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
    )
    if out is not None:
        _write(report, ms, out)
    return report


def _encode_figures(seconds: np.ndarray) -> dict[str, Any]:
    """The report's instruction-encoding figures from the timed encodings (none: None)."""
    if not seconds.size:
        return {"instruction_encode_p50_ms": None, "instruction_encode_max_ms": None}
    return {
        "instruction_encode_p50_ms": float(np.percentile(seconds, 50)) * 1e3,
        "instruction_encode_max_ms": float(seconds.max()) * 1e3,
    }


def encode_line(report: LatencyReport) -> str:
    """The once-per-episode instruction encoding in one line; "" when the bundle has no
    instruction graph."""
    if report.instruction_encode_p50_ms is None:
        return ""
    return (
        f"instruction encoding, once per episode (not in the tick figures): p50 "
        f"{report.instruction_encode_p50_ms:.2f} ms, max {report.instruction_encode_max_ms:.2f} ms"
    )


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
        _write_report(report, out, f"{report.variant}/latency.png")
    return report


def async_line(report: LatencyReport) -> str:
    """An ``async`` gate's own figures in one line (inference alone, action age, seams), as
    the CLI and the run summary show them."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    seam = "-" if report.seam_jump_max is None else f"{report.seam_jump_max:.4g}"
    return (
        f"async: inference p50 {ms(report.inference_p50_ms)} p99 {ms(report.inference_p99_ms)} "
        f"ms; action age p50 {ms(report.action_age_p50_ms)} p99 "
        f"{ms(report.action_age_p99_ms)} ms; largest seam jump {seam} (robot units)"
    )


def _async_rows(report: LatencyReport) -> list[tuple[str, str]]:
    """The ``async`` figures of ``latency.md`` (none in ``sync``)."""
    if report.mode != "async":
        return []

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    seam = "-" if report.seam_jump_max is None else f"{report.seam_jump_max:.4g}"
    return [
        (
            "inference p50 / p99",
            f"{ms(report.inference_p50_ms)} / {ms(report.inference_p99_ms)} ms",
        ),
        (
            "action age p50 / p99",
            f"{ms(report.action_age_p50_ms)} / {ms(report.action_age_p99_ms)} ms",
        ),
        ("largest seam jump", f"{seam} (robot units)"),
    ]


def _write(report: LatencyReport, ms: np.ndarray, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(ms, bins=60, color="#4c72b0")
    for value, label, style in ((report.p99_ms, "p99", "-"), (report.budget_ms, "budget", "--")):
        ax.axvline(value, color="black", ls=style, label=f"{label} {value:.1f} ms")
    ax.set_xlabel("control step latency, ms (observation in -> action out)")
    ax.set_ylabel("steps")
    if report.instruction_encode_p50_ms is not None:
        ax.set_title(encode_line(report).replace(" (not in the tick figures)", ""), fontsize=8)
    ax.legend()
    fig.tight_layout()
    report.histogram = str(out / "latency.png")
    fig.savefig(report.histogram, dpi=100)
    plt.close(fig)
    report.report = str(out / "latency.md")
    _write_report(report, out, "latency.png")


def _write_report(report: LatencyReport, out: Path, histogram: str | None) -> None:
    """``latency.md`` (the histogram at ``histogram``, relative to ``out``; None: no loop ran)
    and ``latency_report.json``."""
    verdict = "PASSED" if report.passed else "FAILED: " + "; ".join(report.reasons)
    rows = [
        (
            "p50 / p95 / p99 / max",
            f"{report.p50_ms:.2f} / {report.p95_ms:.2f} / "
            f"{report.p99_ms:.2f} / {report.max_ms:.2f} ms",
        ),
        ("jitter (std)", f"{report.jitter_ms:.2f} ms"),
        ("deadline misses", f"{report.misses} (allowed {report.allowed_misses})"),
        ("steps", f"{report.steps} after {report.warmup} warm-up"),
        ("variant", report.variant or "-"),
        ("mode", report.mode),
        *_async_rows(report),
        *(
            [
                (
                    "instruction encoding, once per episode (p50 / max)",
                    f"{report.instruction_encode_p50_ms:.2f} / "
                    f"{report.instruction_encode_max_ms or 0:.2f} ms (not in the tick figures)",
                )
            ]
            if report.instruction_encode_p50_ms is not None
            else []
        ),
        *report.measured_on.items(),
    ]
    lines = [
        f"# Latency gate on `{report.target}`: {verdict}",
        "",
        f"Budget: p99 <= {report.budget_ms:g} ms. Export: `{report.export}`.",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
    ]
    if histogram is not None:
        lines += ["", f"![latency histogram]({histogram})"]
    if report.trials:
        lines += [
            "",
            f"## precision: auto — {report.choice}",
            "",
            "| variant | precision | error / action std | p99 | result |",
            "|---|---|---|---|---|",
            *[
                f"| {t.variant} | {t.precision} | {_error(t)} | "
                f"{'-' if t.p99_ms is None else f'{t.p99_ms:.2f} ms'} | "
                f"{'chosen' if t.chosen else t.failure} |"
                for t in report.trials
            ],
        ]
    report.report = str(out / "latency.md")
    (out / "latency.md").write_text("\n".join(lines) + "\n")
    (out / "latency_report.json").write_text(json.dumps(report.to_json(), indent=1))
