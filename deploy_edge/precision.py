"""Precision variants: the registry of the ways a bundle runs, and the rule that chooses one.

A precision variant is a class (:class:`PrecisionVariant`) whose class attributes say what sets
it apart: whether a profile that pins it runs the bundle's variant file of that precision or
the FP32 model (:attr:`~PrecisionVariant.variant_file`), the engines that build it from the FP32
model (:attr:`~PrecisionVariant.from_fp32`) or run a variant file of it
(:attr:`~PrecisionVariant.runs_file`), its error when the export did not score it
(:attr:`~PrecisionVariant.unscored_error`), the parity tolerance a device holds it to, and on
TensorRT the GPU it needs and the builder flag it sets (read by :mod:`deploy_edge.engines`). A
variant file is made and scored against FP32 at export (INT8: :mod:`stages.export.quantize`).
:data:`VARIANTS` names them, most accurate first: the ranking of last resort when two measured
errors tie.

A chooser is not a variant: ``precision: auto`` (:class:`Auto`, in :data:`CHOOSERS`) tries every
way the profile's engine can run the bundle (:func:`options`), each gated, and runs the
most accurate one within the budget (:func:`choose_variant`). A variant the export did not make a
candidate (past its error bar, worse on success) is listed with its reason and never run. Its
decision is recorded once, by the device's trials (:mod:`deploy_edge.agent.trials`: the
deployment's trials and choice, the slot's ``variant`` and ``precision``), and read afterwards
(:func:`deploy_edge.targets.running_option`), never re-derived from a name.

Adding a precision variant = its class (here or in a module of its own) + one line in
:data:`VARIANTS` (one the export makes: also its maker, one line in
:data:`stages.export.config.MAKERS`); a chooser likewise in :data:`CHOOSERS`.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from dataclasses import dataclass
from typing import ClassVar

from deploy_edge.bundle.io_spec import IOSpec
from deploy_edge.wire import Trial

VARIANTS: dict[str, str] = {
    "fp32": "deploy_edge.precision:FP32",
    "fp16": "deploy_edge.precision:FP16",
    "int8": "deploy_edge.precision:INT8",
    "fp8": "deploy_edge.precision:FP8",
}
"""Precision a profile can pin -> ``module:Class`` of its :class:`PrecisionVariant`, most
accurate first."""
CHOOSERS: dict[str, str] = {
    "auto": "deploy_edge.precision:Auto",
}
"""Precision a profile can leave to the device -> ``module:Class`` of its chooser."""
ENGINES = ("onnxruntime", "tensorrt")


class PrecisionVariant:
    """One numeric precision a bundle can run in (see the module docstring)."""

    name: ClassVar[str]
    variant_file: ClassVar[bool] = False
    """Pinned, it runs the bundle's candidate variant file of this precision (an explicit Q/DQ
    graph); False: the FP32 model, in this precision where the engine builds it so."""
    from_fp32: ClassVar[tuple[str, ...]] = ()
    """Engines that build it from the FP32 model, which ``precision: auto`` tries (unless the
    bundle carries a variant file of that name)."""
    runs_file: ClassVar[tuple[str, ...]] = ENGINES
    """Engines that run a bundle variant file of this precision."""
    unscored_error: ClassVar[float | None] = None
    """Its error relative to the action std when built from the FP32 model (0: the FP32 model
    itself; None: the export did not score it, the device measures it at parity)."""
    parity_tolerance: ClassVar[float] = 2e-2
    """Largest |engine - reference| allowed, robot units, where no recorded error says more."""
    min_sm: ClassVar[tuple[int, int] | None] = None
    """TensorRT: the oldest GPU (SM) whose tensor cores run it (None: any)."""
    builder_flag: ClassVar[str | None] = None
    """TensorRT: the builder flag that builds the FP32 model in it (None: none)."""
    refusal: ClassVar[str] = ""
    """TensorRT: which GPUs lack it and what to do instead, where the GPU cannot build it."""


class FP32(PrecisionVariant):
    """The FP32 model as exported: the reference every variant is scored against."""

    name = "fp32"
    from_fp32 = ENGINES
    unscored_error = 0.0
    parity_tolerance = 1e-4


class FP16(PrecisionVariant):
    """The FP32 model built in FP16 by TensorRT (the builder flag, where the GPU has fast
    FP16); ONNX Runtime runs the FP32 model in FP32."""

    name = "fp16"
    from_fp32 = ("tensorrt",)
    builder_flag = "FP16"


class INT8(PrecisionVariant):
    """The export's INT8 Q/DQ graph (:mod:`stages.export.quantize`), run as it is."""

    name = "int8"
    variant_file = True


class FP8(PrecisionVariant):
    """An FP8 Q/DQ graph: TensorRT on SM 8.9+ only (ONNX Runtime's CPU kernels have no FP8
    Q/DQ)."""

    name = "fp8"
    variant_file = True
    runs_file = ("tensorrt",)
    min_sm = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x, Thor); not Orin
    refusal = "(Jetson Orin has no FP8): use an int8 or fp16 profile"


def precision_variant(name: str) -> type[PrecisionVariant]:
    """The class of precision ``name``; an unknown one (a bundle written by a newer robo-pipe)
    gets the base's defaults."""
    if name not in VARIANTS:
        return PrecisionVariant
    variant: type[PrecisionVariant] = pkgutil.resolve_name(VARIANTS[name])
    return variant


@dataclass(frozen=True)
class Option:
    """One way to run a bundle: its name (:attr:`~deploy_edge.wire.Trial.variant`), precision,
    and the bundle variant whose file runs (None: the FP32 model)."""

    name: str
    precision: str
    variant: str | None


FP32_MODEL = Option(FP32.name, FP32.name, None)
"""The FP32 model as exported."""


class PinError(LookupError):
    """A pinned precision the bundle cannot run (the message says why)."""


def pinned_run(spec: IOSpec, precision: str) -> Option:
    """What a pinned ``precision`` runs: the FP32 model, or the bundle's candidate variant of
    that precision (:class:`PinError` if it has none)."""
    if not precision_variant(precision).variant_file:
        return Option(precision, precision, None)
    found = [v for v in spec.variants if v.precision == precision]
    usable = [v for v in found if v.candidate]
    if not usable:
        raise PinError(
            f"its {precision} variant is not a candidate ({found[0].reason})"
            if found
            else f"it has no {precision} variant (variants: "
            f"{', '.join(v.name for v in spec.variants) or 'none'})"
        )
    return Option(usable[0].name, precision, usable[0].name)


def trial_error(option: Option, spec: IOSpec) -> float | None:
    """The option's recorded error relative to the action std (0 for the FP32 model, None for
    TensorRT's FP16 build of it, which the export did not score)."""
    if option.variant is None:
        return precision_variant(option.precision).unscored_error
    variant = spec.variant(option.variant)
    return variant.relative_error if variant is not None else None


def accuracy_rank(trial: Trial) -> tuple[float, int]:
    """Sort key, most accurate first: the smaller recorded error relative to the action std
    (an unscored one after every scored one), ties by :data:`VARIANTS` order."""
    error = trial.relative_error if trial.relative_error is not None else float("inf")
    order = list(VARIANTS)
    precision = order.index(trial.precision) if trial.precision in VARIANTS else 99
    return (error, precision)


@dataclass
class Choice:
    """What :func:`choose_variant` decided: the trial that runs (None: none fits), every trial
    marked (``chosen``; why not in ``failure``), and one line saying why."""

    chosen: Trial | None
    trials: list[Trial]
    reason: str


def options(spec: IOSpec, engine: str) -> tuple[list[Option], list[Trial]]:
    """What ``precision: auto`` tries on ``engine``: the FP32 model built in each precision
    the engine builds from it (FP32; on TensorRT, FP16), then every candidate variant the
    engine runs; and a trial that is already out (with its reason) for every variant that is
    not a candidate or that the engine cannot run."""
    tried = [
        Option(name, name, None)
        for name in VARIANTS
        if engine in precision_variant(name).from_fp32 and spec.variant(name) is None
    ]
    out: list[Trial] = []
    for v in spec.variants:
        if not v.candidate:
            why = f"not a candidate: {v.reason or 'the export did not make it one'}"
            out.append(Trial(v.name, v.precision, v.relative_error, False, why))
        elif engine not in precision_variant(v.precision).runs_file:
            why = f"{engine} does not run {v.precision} variants"
            out.append(Trial(v.name, v.precision, v.relative_error, True, why))
        else:
            tried.append(Option(v.name, v.precision, v.name))
    return tried, out


def choose_variant(trials: list[Trial], budget_ms: float) -> Choice:
    """The rule of ``precision: auto``: of the trials that are candidates, built, within their
    parity and gate (no ``failure``) and whose p99 <= ``budget_ms``, the most accurate
    (:func:`accuracy_rank`). A non-candidate is never chosen. None fits: no choice, and the
    reason names each trial's p99 against the budget (or why it was out). The trials come
    back as copies, each marked: chosen, or why not (``failure``)."""
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
        t.failure = f"less accurate than {best.variant} ({error_text(t)} vs {error_text(best)})"
    return Choice(
        best,
        marked,
        f"{best.variant}: the most accurate candidate within {budget_ms:g} ms "
        f"(p99 {best.p99_ms:.2f} ms, error {error_text(best)} of the action std)",
    )


class Auto:
    """``precision: auto``: the most accurate way to run the bundle that meets the budget on
    this machine (a chooser, not a variant: see the module docstring)."""

    options = staticmethod(options)
    choose = staticmethod(choose_variant)


def chooser(precision: str) -> type[Auto] | None:
    """The chooser a profile's ``precision`` names (None: a pinned precision)."""
    if precision not in CHOOSERS:
        return None
    found: type[Auto] = pkgutil.resolve_name(CHOOSERS[precision])
    return found


def error_text(trial: Trial) -> str:
    """A trial's error relative to the action std as the reports print it."""
    return "unscored" if trial.relative_error is None else f"{trial.relative_error:.2%}"
