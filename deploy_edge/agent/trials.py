"""Build, check and gate each precision option: the deployer's engine, parity and gate steps.

    build     the target profile's engine on the bundle: its pinned precision's model or
              variant, or with ``precision: auto`` every option that builds
    parity    each engine on the bundle's reference inputs reproduces the expected outputs
              (a variant: within its recorded ``reference_error`` plus a margin; an option
              the export did not score, TensorRT's FP16 build, has its error relative to the
              action std measured here on those inputs, so that the choice can rank it)
    gate      the latency gate on the device's robot (the release's budget, else the
              profile's); with ``precision: auto`` every option still in, then the choice

Each function fills the :class:`~deploy_edge.wire.Deployment` record it is given (``variant``,
``trials``, ``choice``, ``gate``), returns the step's one-line detail and raises
:class:`Refused` (its message says what it measured) when the step fails. A candidate is one
way to run the bundle: its :class:`~deploy_edge.wire.Trial` record and its open engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.agent.config import DeviceConfig, DriverFactory
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.bundle.layout import NORMALIZATION_FILE, REFERENCE_FILE
from deploy_edge.exported import ExportedPolicy
from deploy_edge.latency import gate_trial, run_gate
from deploy_edge.latency_report import LatencyReport
from deploy_edge.precision import Option, accuracy_rank, precision_variant, trial_error
from deploy_edge.release.manifest import Manifest
from deploy_edge.targets import TargetProfile, pinned_option
from deploy_edge.wire import Deployment, GateFigures, Slot, Trial

VARIANT_MARGIN = (0.5, 1e-4)
"""A precision variant's parity tolerance: its recorded ``reference_error`` (the export's
|variant - torch| on the same reference inputs) times ``1 + VARIANT_MARGIN[0]`` plus
``VARIANT_MARGIN[1]`` robot units: another CPU's (or TensorRT's) quantised kernels round
differently from the exporting machine's."""

Candidate = tuple[Trial, ExportedPolicy]
"""One way to run the bundle: its trial record and its open engine."""


class Refused(Exception):
    """A step's check failed (the message says what it measured)."""


def build(
    deployment: Deployment, slot: Slot, profile: TargetProfile
) -> tuple[list[Candidate], str]:
    """The profile's engine on the bundle: its pinned precision's model or variant, or,
    with ``precision: auto``, every option that builds (one that does not is out, its
    trial saying why). Returns the candidates and the step's detail."""
    p = profile
    spec = read_io_spec(slot.path)
    if p.chooser is None:
        option = pinned_option(spec, p)
        policy = _open(slot, option, profile)
        trial = Trial(option.name, option.precision, trial_error(option, spec))
        deployment.variant = policy.variant
        detail = f"{policy.engine.name} ({policy.variant}, {policy.engine.precision})"
        return [(trial, policy)], detail
    tried, out_of_it = p.chooser.options(spec, p.engine)
    built: list[Candidate] = []
    out: list[Trial] = []
    for option in tried:
        trial = Trial(option.name, option.precision, trial_error(option, spec))
        out.append(trial)
        try:
            built.append((trial, _open(slot, option, profile)))
        except Exception as err:  # one option's fault puts it out, not the deployment
            trial.failure = f"engine: {type(err).__name__}: {err}"
    deployment.trials = out + out_of_it
    if not built:
        raise Refused("no way to run the bundle builds here: " + _failures(out))
    detail = f"{built[0][1].engine.name}: " + ", ".join(t.variant for t, _ in built)
    return built, detail


def _open(slot: Slot, option: Option, profile: TargetProfile) -> ExportedPolicy:
    spec = read_io_spec(slot.path)
    variant = spec.variant(option.variant) if option.variant else None
    tolerance = _tolerance(option.precision, variant.reference_error if variant else None)
    p = profile
    return ExportedPolicy(
        slot.path,
        p.engine,
        option.precision,
        p.threads,
        option.variant,
        tolerance,
        added_ms=p.added_inference_ms,
    )


def parity(
    deployment: Deployment, engines: list[Candidate], slot: Slot, profile: TargetProfile
) -> tuple[list[Candidate], str]:
    """Each engine on the reference inputs; pinned: a miss refuses; auto: a miss puts
    that option out and the rest go on (all out: refused). Returns the candidates that
    passed and the step's detail."""
    reference_file = Path(slot.path) / REFERENCE_FILE
    if not reference_file.is_file():
        raise Refused(f"the bundle has no {REFERENCE_FILE} to check parity with")
    with np.load(reference_file, allow_pickle=False) as data:
        reference = {k: data[k] for k in data.files}
    spec = read_io_spec(slot.path)
    passed, details = [], []
    for trial, policy in engines:
        variant = spec.variant(trial.variant)
        recorded = variant.reference_error if variant is not None else None
        tolerance = _tolerance(policy.engine.precision, recorded)
        try:
            error, batch, actions = _parity_error(policy, reference)
        except Refused as err:
            trial.failure = f"parity: {err}"
            continue
        if trial.relative_error is None:  # TensorRT's FP16 build: the export scored none
            trial.relative_error = _relative_error(actions, reference, Path(slot.path))
        if not error <= tolerance:  # NaN fails too
            trial.failure = (
                f"parity: max |error| {error:.2e} > tolerance {tolerance:g} on {REFERENCE_FILE}"
            )
            continue
        passed.append((trial, policy))
        details.append(
            f"{trial.variant}: max |error| {error:.2e} <= {tolerance:g}"
            if profile.chooser is not None
            else f"max |error| {error:.2e} <= {tolerance:g} over {batch} reference inputs"
        )
    if not passed:
        if profile.chooser is None:
            raise Refused(engines[0][0].failure.removeprefix("parity: "))
        raise Refused("no way to run the bundle passed its parity: " + _failures(deployment.trials))
    return passed, "; ".join(details)


def gate(
    deployment: Deployment,
    engines: list[Candidate],
    slot: Slot,
    manifest: Manifest,
    profile: TargetProfile,
    config: DeviceConfig,
    driver: DriverFactory,
) -> str:
    """The latency gate (every option still in, with ``precision: auto``, then the
    choice); ``deployment.variant`` says what runs, and the slot records it with the precision
    it runs in (:attr:`~deploy_edge.wire.Slot.precision`). The release's ``budget_ms`` is the
    p99 budget (None: the profile's); a release gated on this device's profile is refused when
    the inference measured here is slower than the one it was gated at by more than the
    profile's ``inference_margin_ms`` (:func:`check_gated_inference`). Returns the step's
    detail."""
    budget_ms = manifest.budget_ms
    c = config
    chooser = profile.chooser
    auto = chooser is not None
    reports, policies = {}, {}
    for trial, policy in engines:
        report = run_gate(
            slot.path,
            driver(policy.cameras, policy.image_size),
            c.instruction,
            profile,
            steps=c.gate_steps,
            warmup=c.gate_warmup,
            budget_ms=budget_ms,
            pace=c.pace,
            out=Path(slot.path) / "gate" / (trial.variant if auto else ""),
            policy=policy,
        )
        gate_trial(trial, report)
        reports[trial.variant], policies[trial.variant] = report, policy
    if chooser is not None:
        budget = budget_ms if budget_ms is not None else profile.budget_ms
        choice = chooser.choose(deployment.trials, budget)
        deployment.trials, deployment.choice = choice.trials, choice.reason
        if choice.chosen is None:
            measured = [t for t in choice.trials if t.variant in reports]
            if measured:  # the figures of the most accurate one measured
                best = min(measured, key=accuracy_rank)
                deployment.gate = _figures(reports[best.variant])
            raise Refused(choice.reason)
        report, running = reports[choice.chosen.variant], policies[choice.chosen.variant]
        deployment.variant = choice.chosen.variant
    else:
        report, running = next(iter(reports.values())), engines[0][1]
    deployment.gate = _figures(report)
    if not report.passed:
        raise Refused("; ".join(report.reasons))
    check_gated_inference(manifest, profile, report)
    # The decision, recorded once: what runs and in what precision (read, never re-derived).
    slot.variant, slot.precision = deployment.variant, running.engine.precision
    chosen = f"{deployment.choice}; " if auto else ""
    detail = (
        f"{chosen}{report.mode}: p99 {report.p99_ms:.2f} ms <= {report.budget_ms:g} ms, "
        f"{report.misses} misses in {report.steps} steps"
    )
    if report.mode == "async":  # what the asynchronous loop was judged on too
        detail += (
            f"; inference p50/p99 {report.inference_p50_ms:.2f}/"
            f"{report.inference_p99_ms:.2f} ms, action age p99 "
            f"{report.action_age_p99_ms or 0:.2f} ms, largest seam jump "
            f"{report.seam_jump_max or 0:.4g}"
        )
    return detail


def check_gated_inference(
    manifest: Manifest, profile: TargetProfile, report: LatencyReport
) -> None:
    """Refuse a release that would wait longer for its inferences here than where it was
    gated: the pipeline's latency gate measured it on this same profile, and its success at
    device latency was judged at that delay, in control ticks
    (:meth:`~deploy_edge.targets.TargetProfile.delay_ticks`, the rule the gate used). The ticks here
    (``report``: this device's gate) must not be more. Ticks, not milliseconds: a scheduling
    hiccup that does not move the robot's delay is not a reason. Nothing to compare (gated on
    another profile, or before the figure was recorded): nothing refused."""
    gated_ms = manifest.gated_inference_ms
    if manifest.gated_target != profile.name or gated_ms is None or not report.control_hz:
        return
    period_ms, measured_ms = 1000.0 / report.control_hz, report.inference_ms
    gated = profile.delay_ticks(gated_ms, period_ms)
    here = profile.delay_ticks(measured_ms, period_ms)
    if here > gated:
        margin = profile.delay_margin_ms
        plus = f" with the {margin:g} ms margin" if margin else ""
        raise Refused(
            f"inference p99 {measured_ms:.1f} ms on this device, {here} ticks of "
            f"{period_ms:g} ms{plus}; the release was gated on {profile.name} at "
            f"{gated_ms:.1f} ms ({gated} ticks), the delay its success at device latency was "
            "judged at"
        )


def _tolerance(precision: str, reference_error: float | None) -> float:
    """Parity tolerance: a variant's recorded error plus the margin, else the precision's."""
    if reference_error is not None:
        return reference_error * (1.0 + VARIANT_MARGIN[0]) + VARIANT_MARGIN[1]
    return precision_variant(precision).parity_tolerance


def _parity_error(
    policy: ExportedPolicy, reference: dict[str, np.ndarray]
) -> tuple[float, int, np.ndarray | None]:
    """Largest |engine - expected| over the reference inputs (one at a time: an engine may be
    built for batch 1), how many inputs, and the engine's actions on them. With an
    instruction graph, the chain: the reference tokens through it, its features to the
    policy graph (:meth:`~deploy_edge.exported.ExportedPolicy.reference_feeds`)."""
    engine = policy.engine
    outputs = [n for n in engine.output_names if f"expected_{n}" in reference]
    if not outputs:
        raise Refused(f"{REFERENCE_FILE} holds no expected outputs")
    batch = len(reference[engine.input_names[0]])
    error, actions = 0.0, []
    for i in range(batch):
        got = engine.run(policy.reference_feeds({k: v[i : i + 1] for k, v in reference.items()}))
        for name in outputs:
            want = reference[f"expected_{name}"][i : i + 1]
            error = max(error, float(np.abs(got[name] - want).max()))
        if "actions" in got:
            actions.append(got["actions"])
    return error, batch, np.concatenate(actions) if actions else None


def _relative_error(
    actions: np.ndarray | None, reference: dict[str, np.ndarray], bundle: Path
) -> float | None:
    """The worst action dimension's mean |engine - torch| over the reference inputs divided by
    that dimension's std in the training data (``normalization.json``): the export's
    ``relative_error``, measured here on the reference inputs for an option the export did not
    score; None without the figures to measure it."""
    stats = bundle / NORMALIZATION_FILE
    if actions is None or "expected_actions" not in reference or not stats.is_file():
        return None
    try:
        std = np.asarray(json.loads(stats.read_text())["action_std"], dtype=np.float64)
    except (ValueError, KeyError, TypeError):
        return None
    diff = np.abs(actions - reference["expected_actions"]).reshape(-1, std.shape[-1])
    return float((diff.mean(axis=0) / np.maximum(std, 1e-12)).max())


def _figures(report: Any) -> GateFigures:
    return GateFigures(
        p50_ms=report.p50_ms,
        p95_ms=report.p95_ms,
        p99_ms=report.p99_ms,
        max_ms=report.max_ms,
        misses=float(report.misses),
        budget_ms=report.budget_ms,
        mode=report.mode,
        instruction_encode_p50_ms=report.instruction_encode_p50_ms,
        inference_p99_ms=report.inference_p99_ms,
        action_age_p99_ms=report.action_age_p99_ms,
        seam_jump_max=report.seam_jump_max,
    )


def _failures(trials: list[Trial]) -> str:
    return "; ".join(f"{t.variant}: {t.failure}" for t in trials if t.failure)
