"""Target profiles: how a policy runs on one kind of machine.

A target profile (``configs/targets/<name>.yaml``, package data of :mod:`configs`) says how a
policy runs on one kind of machine: engine, precision, the latency budget at p99 and the
deadline misses allowed, and the mode the loop runs in (the latency gate,
:mod:`deploy_edge.latency`, judges a bundle against it).

Control rate: a policy runs at its own, the one its bundle was made for (io_spec ``control_hz``,
its robot's), so a tick's deadline is one of its periods (:func:`control_rate`). A profile may
set ``control_hz`` as an explicit what-if (e.g. a slow VLA judged at 0.25 Hz). A robot other
than the one the bundle was made for (io_spec ``robot``), or connected at a rate other than the
bundle's, is refused before any tick (:func:`check_robot`).

Precision: pinned (a key of :data:`deploy_edge.precision.VARIANTS`: ``fp32``, ``fp16``,
``int8``, ``fp8``) runs one thing: ``fp32`` and ``fp16`` the bundle's FP32 model (ONNX Runtime
runs it in FP32; TensorRT builds it in FP16 with the builder flag), ``int8`` and ``fp8`` the
bundle's candidate variant of that precision (its explicit Q/DQ graph, :func:`pinned_option`).
Or a chooser (:data:`deploy_edge.precision.CHOOSERS`): ``auto`` tries every way the profile's
engine can run the bundle, gates each, and runs the most accurate one that meets the budget.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from configs import targets_dir
from deploy_edge.async_loop import Blend, inference_ticks
from deploy_edge.bundle.io_spec import IOSpec
from deploy_edge.precision import (
    CHOOSERS,
    FP32_MODEL,
    VARIANTS,
    Auto,
    Option,
    PinError,
    chooser,
    pinned_run,
)
from robo_pipe.errors import RoboPipeError
from robo_pipe.validation import first_error, one_of

TARGETS_DIR = targets_dir()
"""The shipped target profiles (package data of :mod:`configs`)."""


class TargetError(RoboPipeError, ValueError):
    """An unknown target name, or a target profile that is not valid (the message names the
    file, field and value)."""


class RobotMismatch(RoboPipeError, ValueError):
    """A robot other than the one the bundle was made for, or the same robot connected at a
    control rate other than the bundle's."""


class TargetProfile(BaseModel):
    """How a policy runs on one kind of machine."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    description: str = ""
    engine: Literal["onnxruntime", "tensorrt"] = "onnxruntime"
    """Inference engine (TensorRT builds its engine on the target)."""
    precision: Annotated[str, AfterValidator(one_of({**VARIANTS, **CHOOSERS}, "precision"))] = (
        "fp32"
    )
    """Pinned (a key of :data:`~deploy_edge.precision.VARIANTS`, see the module docstring), or
    a chooser (``auto``: the most accurate way to run the bundle that meets the budget on this
    machine)."""
    threads: int = Field(default=1, ge=1, le=256)
    """CPU threads for the engine."""
    control_hz: float | None = Field(default=None, gt=0, le=1000)
    """None (the default): a policy is gated and run at its own rate, the bundle's (its robot's,
    :func:`control_rate`). Set: an explicit what-if rate the gate judges a tick's deadline
    against instead, and its report says so."""
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
    (:class:`~deploy_edge.async_loop.ChunkQueue`)."""
    added_inference_ms: float = Field(default=0.0, ge=0, le=60_000)
    """A slower device played on this one: every inference of the policy graph sleeps this
    long first, so the latency gate, the delay it implies and the agent's own gate measure a
    device this much slower (a what-if profile, and the tests' slower device; 0 on a real
    device's profile)."""

    @model_validator(mode="after")
    def _async_has_an_age_budget(self) -> TargetProfile:
        if self.mode == "async" and self.action_age_budget_ms is None:
            raise ValueError(
                "mode: async needs action_age_budget_ms (the p99 budget of observation -> "
                "action sent)"
            )
        return self

    @property
    def delay_margin_ms(self) -> float:
        """Added to an inference p99 before its delay is counted in ticks: ``async``, the
        profile's ``inference_margin_ms`` (the queue's copy, scheduling); ``sync``, none (the
        tick's p99 is measured whole, copies included)."""
        return self.inference_margin_ms if self.mode == "async" else 0.0

    def delay_ticks(self, inference_ms: float, period_ms: float) -> int:
        """Control ticks a robot waits for its actions on this profile, with inferences of
        ``inference_ms`` (p99) at a period of ``period_ms``: the delay a release's success at
        device latency is judged at (:mod:`stages.evaluate.at_delay`) and the one a device
        holds it to (:func:`deploy_edge.agent.trials.check_gated_inference`): one rule, so the
        two count the same ticks.

        ``sync``: 0 while the tick's p99 fits in its period (the robot acts in the tick it
        observes), else ``ceil(p99 / period)`` (the ticks it holds). ``async``:
        :func:`~deploy_edge.async_loop.inference_ticks` with the margin, at least 1."""
        if self.mode == "sync" and inference_ms <= period_ms:
            return 0
        margin_s = self.delay_margin_ms / 1000.0
        return inference_ticks(inference_ms / 1000.0, margin_s, period_ms / 1000.0)

    @property
    def chooser(self) -> type[Auto] | None:
        """The chooser its ``precision`` names (None: pinned)."""
        return chooser(self.precision)


def control_rate(spec: IOSpec, target: TargetProfile) -> float:
    """The rate, Hz, a policy is gated and run at on ``target``: the bundle's own (``spec``'s
    ``control_hz``, the rate of the robot it was made for), unless the profile sets one (an
    explicit what-if, :func:`rate_note`). A tick's deadline is one period of it."""
    return spec.control_hz if target.control_hz is None else target.control_hz


def rate_note(spec: IOSpec, target: TargetProfile) -> str:
    """One line when ``target``'s rate overrides a different one of the bundle's; "" when the
    policy runs at its own."""
    rate = control_rate(spec, target)
    if math.isclose(rate, spec.control_hz):
        return ""
    return (
        f"control rate {rate:g} Hz from target {target.name!r} (a what-if), not the bundle's "
        f"{spec.control_hz:g} Hz: tick deadline {1000.0 / rate:g} ms"
    )


def check_robot(spec: IOSpec, robot_name: str, robot_hz: float) -> None:
    """Refuse, before any tick, a robot other than the bundle's (its state and actions mean
    something else: a policy for rp5 must never command another arm), and a robot whose control
    rate differs from the bundle's (the policy's actions are steps of its own period, and the
    loop paces on the robot's).

    Raises:
        RobotMismatch: the two robots, or the two rates, named.
    """
    if robot_name != spec.robot:
        raise RobotMismatch(
            f"robot {robot_name!r} cannot run a bundle made for robot {spec.robot!r}: deploy "
            f"it to a device whose driver drives {spec.robot!r}"
        )
    if not math.isclose(robot_hz, spec.control_hz):
        raise RobotMismatch(
            f"robot {robot_name!r} runs at {robot_hz:g} Hz but the bundle was made for "
            f"{spec.control_hz:g} Hz: run it on a robot of the bundle's rate (the config's "
            f"robot that exported it)"
        )


def pinned_option(spec: IOSpec, target: TargetProfile) -> Option:
    """What ``target``'s pinned precision runs: the FP32 model, or the bundle's candidate
    variant of that precision (:class:`TargetError` if it has none)."""
    try:
        return pinned_run(spec, target.precision)
    except PinError as err:
        raise TargetError(
            f"target {target.name!r} pins precision {target.precision}, but {err}"
        ) from err


def running_option(
    spec: IOSpec, target: TargetProfile, variant: str = "", precision: str = ""
) -> Option:
    """What runs as a deployment's trials recorded it (a slot's ``variant`` and
    ``precision``). A slot recorded before variants (``variant`` ""): as ``target`` pins it,
    the FP32 model under a chooser; one recorded before precisions (``precision`` ""): a bundle
    variant's own precision, else the FP32 model in the precision it is named after."""
    if not variant:
        return pinned_option(spec, target) if target.chooser is None else FP32_MODEL
    found = spec.variant(variant)
    if found is not None:
        return Option(variant, precision or found.precision, variant)
    return Option(variant, precision or variant, None)


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
