"""Target profiles and the latency gate.

A target profile (``configs/targets/<name>.yaml``, package data of :mod:`configs`) says how a
policy runs on one kind of machine: engine, precision, control rate, the latency budget at p99
and the deadline misses allowed. The gate warms up, then runs ``steps`` control ticks of the
whole loop (:class:`deploy_edge.runtime.ControlLoop`) on this machine and passes only if
p99 <= budget and misses <= allowed; the report says which check failed and what it measured on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from configs import targets_dir
from deploy_edge.exported import ExportedPolicy
from deploy_edge.runtime import ControlLoop, Tick
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
    precision: Literal["fp32", "fp16"] = "fp32"
    threads: int = Field(default=1, ge=1, le=256)
    """CPU threads for the engine."""
    control_hz: float = Field(default=10.0, gt=0, le=1000)
    """Control rate; a tick's deadline is one period."""
    budget_ms: float = Field(default=100.0, gt=0)
    """p99 latency budget of the whole control step."""
    allowed_misses: int = Field(default=0, ge=0)
    """Deadline misses tolerated over the measured steps."""
    execute: int = Field(default=1, ge=1)
    """Actions of each chunk executed before inferring again."""


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


def target_loop(
    policy: ExportedPolicy, robot: Robot, instruction: str, target: TargetProfile, pace: bool
) -> ControlLoop:
    """The control loop as ``target`` runs it: its rate (one period is a tick's deadline) and
    the actions executed per inferred chunk."""
    return ControlLoop(
        policy,
        robot,
        instruction,
        execute=min(target.execute, policy.chunk_len),
        deadline_s=1.0 / target.control_hz,
        pace=pace,
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
    """Measure the whole control step of ``export_dir`` on ``robot`` and gate it."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    policy = policy or ExportedPolicy(export_dir, target.engine, target.precision, target.threads)
    budget = budget_ms if budget_ms is not None else target.budget_ms
    robot.connect()
    try:
        loop = target_loop(policy, robot, instruction, target, pace)
        loop.run(warmup)
        ticks: list[Tick] = loop.run(steps)
    finally:
        robot.stop()
    ms = np.array([t.latency_s for t in ticks]) * 1000.0
    misses = sum(t.missed for t in ticks)
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
        **verdict(ms, misses, budget, target.allowed_misses),
    )
    if out is not None:
        _write(report, ms, out)
    return report


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
    ax.legend()
    fig.tight_layout()
    report.histogram = str(out / "latency.png")
    fig.savefig(report.histogram, dpi=100)
    plt.close(fig)
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
        "",
        "![latency histogram](latency.png)",
    ]
    report.report = str(out / "latency.md")
    (out / "latency.md").write_text("\n".join(lines) + "\n")
    (out / "latency_report.json").write_text(json.dumps(report.to_json(), indent=1))
