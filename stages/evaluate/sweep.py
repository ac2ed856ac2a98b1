"""The delay sweep: a policy's success in simulation as its inference delay grows (issue 52).

One suite (``evaluate``'s held-out variants and seeds) played at ``d`` = 0, 2, 4, 8, 12 and 16
control ticks of inference delay, in both of the runtime's modes, every point on the same
seeds (:mod:`stages.evaluate.delay` plays them: ``sync`` holds the arm while the engine works,
``async`` keeps the runtime's chunk queue). ``d = 0`` is today's evaluation, the same in
either mode, so it is played once. An async point whose chunk cannot cover the delay (the
runtime's rule: ``chunk_len >= 2 d``) is not played: its row says why, as a device would refuse
it. The delay a device will have (its inference p99 plus the runtime's margin, in ticks) is
marked, so a user sees where the policy will sit on the curve; so are real VLAs' delays
(:data:`REFERENCE_DELAYS`: the 250 M preset measured on this CPU, a published Jetson figure).

Written as ``delay_sweep.md`` (the table), ``delay_sweep.png`` (the curve) and
``delay_sweep.json`` (:class:`DelaySweep`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deploy_edge.async_loop import async_shortfall, inference_ticks
from robo_pipe.records import Record
from robots.spec import get_robot
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.seeds import episode_seeds
from stages.evaluate.config import EvalConfig
from stages.evaluate.delay import DelayPlan, check_plan
from stages.evaluate.shards import ShardOutcome, Suite, check_policy_fits, plan_shards
from stages.statistics import wilson_interval

SWEEP_TICKS = (0, 2, 4, 8, 12, 16)
"""Delays swept, control ticks (at 10 Hz: 0 to 1.6 s of inference)."""
MODES = ("sync", "async")


@dataclass
class SweepMark(Record):
    """Where a real VLA would sit on the curve: an inference p99 measured or published for
    it, in ticks with the device runtime's margin."""

    label: str
    inference_ms: float
    ticks: int
    source: str


REFERENCE_DELAYS = (
    (
        "256M preset, this CPU, 1 thread",
        1431.0,
        "benchmarks/vla_scale.py on this 2-core machine kind, 2026-11-26 (docs/vla-at-size.md): "
        "ONNX Runtime FP32 p99, random weights",
    ),
    (
        "256M preset, this CPU, 2 threads",
        819.0,
        "the same run, 2 threads",
    ),
    (
        "GR00T N1.5 3B, Jetson AGX Orin",
        66.0,
        "NVIDIA Isaac-GR00T deployment_scripts/README.md, TensorRT FP16 module latencies "
        "(trtexec, batch 1), summed here: ViT 12.0 + LLM 17.3 + backbone adapter 5.2 + 4 DiT "
        "steps x 7.8 + encoders 0.3 ms; model time only, no data transfer",
    ),
)
"""(label, inference p99 ms, source) of the marks every sweep shows (issue 52): the 250 M
preset measured on this CPU, and a published Jetson figure of a shipped VLA."""


def reference_marks(period_ms: float, margin_ms: float) -> list[SweepMark]:
    """:data:`REFERENCE_DELAYS` in ticks of ``period_ms`` with ``margin_ms`` added (the device
    runtime's, as the device's own delay is counted)."""
    return [
        SweepMark(label, ms, inference_ticks(ms / 1000, margin_ms / 1000, period_ms / 1000), src)
        for label, ms, src in REFERENCE_DELAYS
    ]


@dataclass
class SweepPoint(Record):
    """One delay in one mode: its success on the sweep's seeds, or why it was not played."""

    mode: str
    ticks: int
    episodes: int = 0
    successes: int = 0
    success_rate: float | None = None
    ci95: tuple[float, float] | None = None
    """Wilson 95% interval of ``success_rate``."""
    refused: str = ""
    """Why the point was not played (an async chunk too short for the delay); "" if it was."""


@dataclass
class DelaySweep(Record):
    """A policy's success against its inference delay (see the module docstring)."""

    policy: str
    period_ms: float
    """The control period: one tick."""
    chunk_len: int
    variants: list[str]
    seeds: int
    """Seeds per variant, the same at every point."""
    points: list[SweepPoint] = field(default_factory=list)
    expected_ticks: int | None = None
    """The delay the device will have, in ticks (None: not given)."""
    expected: str = ""
    """Where ``expected_ticks`` comes from, for people."""
    marks: list[SweepMark] = field(default_factory=list)
    """Where real VLAs would sit (:data:`REFERENCE_DELAYS`)."""

    def point(self, mode: str, ticks: int) -> SweepPoint:
        """The point of ``mode`` at ``ticks`` (``d = 0`` is one play, listed in both modes)."""
        return next(p for p in self.points if p.mode == mode and p.ticks == ticks)


def sweep_plan(mode: str, ticks: int, period_ms: float, base: EvalConfig) -> DelayPlan:
    """The delay plan of ``ticks`` whole ticks in ``mode`` (the blend and execute settings of
    ``base.delay``): an inference of exactly ``ticks`` periods, no margin."""
    return DelayPlan(
        mode=mode,
        inference_ms=ticks * period_ms,
        margin_ms=0.0,
        period_ms=period_ms,
        ticks=ticks,
        source="the delay sweep",
        blend=base.delay.blend,
        blend_ticks=base.delay.blend_ticks,
        execute=base.delay.execute,
    )


def delay_sweep(
    policy: str | Path,
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    config: EvalConfig,
    seed: int,
    ticks: tuple[int, ...] = SWEEP_TICKS,
    expected_ms: float | None = None,
    margin_ms: float = 20.0,
    ray_address: str | None = None,
    on_shard: Callable[[ShardOutcome], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    name: str = "",
) -> DelaySweep:
    """Play ``policy`` on ``config``'s suite at each delay of ``ticks`` in both modes, on the
    same seeds (``config.episodes`` per variant); ``expected_ms``: the device's inference p99:
    with its runtime's ``margin_ms`` added (the target profile's ``inference_margin_ms``), that
    delay is played too and marked: the delay of the device's asynchronous loop (a sync loop
    whose inference fits in its period acts in the same tick: d = 0).
    ``on_plan`` gets the number of episodes to play before the first is played; ``name``: the
    policy as the user named it (default: its path).

    Raises:
        SceneError / PolicySpecError: a suite or policy that does not fit, before any episode.
        DelayError: a sync ``evaluate.delay.execute`` longer than the policy's chunk.
    """
    spec = get_robot(robot)
    period_ms = 1000.0 / spec.control_hz
    acting = check_policy_fits(policy, robot)
    expected, why = None, ""
    if expected_ms is not None:
        expected = inference_ticks(expected_ms / 1000.0, margin_ms / 1000.0, period_ms / 1000.0)
        why = (
            f"inference p99 {expected_ms:.1f} ms + margin {margin_ms:g} ms = {expected} "
            f"ticks of {period_ms:g} ms"
        )
    points: list[SweepPoint] = []
    played: list[SweepPoint] = []  # played[i] plays plans[i]: the Suite's policy i
    plans: list[DelayPlan | None] = []
    for d in sorted(set(ticks) | ({expected} if expected is not None else set())):
        for mode in MODES:
            point = SweepPoint(mode=mode, ticks=d)
            points.append(point)
            if d == 0:  # today's evaluation in either mode: played once, for sync
                if mode == MODES[0]:
                    played.append(point)
                    plans.append(None)
                continue
            if mode == "async" and async_shortfall(
                acting.chunk_len, period_ms / 1000, d * period_ms / 1000, 0
            ):  # the runtime's own refusal (its message has the arithmetic)
                point.refused = (
                    f"a chunk of {acting.chunk_len} actions covers at most "
                    f"{acting.chunk_len // 2} ticks (the runtime needs 2 x {d})"
                )
                continue
            played.append(point)
            plans.append(check_plan(sweep_plan(mode, d, period_ms, config), acting, str(policy)))
    seeds = episode_seeds(seed, config.episodes, "eval")
    policies: list[str | Path] = [policy] * len(plans)
    with Suite(policies, robot, scene, sim, config, ray_address, on_shard, delays=plans) as suite:
        shards = [
            shard
            for i in range(len(plans))
            for shard in plan_shards(
                suite.variants, seeds, config.episodes_per_shard, policy=i, record=False
            )
        ]
        if on_plan is not None:
            on_plan(sum(len(shard.seeds) for shard in shards))
        outcomes = suite.play(shards)
        variants = suite.variants
    for i, point in enumerate(played):
        wins = [e.success for o in outcomes if o.shard.policy == i for e in o.episodes]
        point.episodes, point.successes = len(wins), sum(wins)
        point.success_rate = point.successes / max(point.episodes, 1)
        point.ci95 = wilson_interval(point.successes, point.episodes)
    zero = next((p for p in played if p.ticks == 0), None)
    for point in points:  # d = 0 in the other mode: the same play
        if zero is not None and point.ticks == 0 and point is not zero:
            point.episodes, point.successes = zero.episodes, zero.successes
            point.success_rate, point.ci95 = zero.success_rate, zero.ci95
    sweep = DelaySweep(
        name or str(policy), period_ms, acting.chunk_len, variants, len(seeds), points
    )
    sweep.expected_ticks, sweep.expected = expected, why
    sweep.marks = reference_marks(period_ms, margin_ms)
    return sweep


def point_words(point: SweepPoint) -> str:
    """A point for people: its success and interval, or why it was not played."""
    if point.refused:
        return f"not played: {point.refused}"
    if point.success_rate is None or point.ci95 is None:
        return "-"
    low, high = point.ci95
    return f"{point.success_rate:.1%} ({low:.1%} - {high:.1%})"


def delay_label(sweep: DelaySweep, ticks: int) -> str:
    """A delay for people, in ticks and ms, marked where it is the device's."""
    mark = " <- the device's" if ticks == sweep.expected_ticks else ""
    return f"{ticks} ticks ({ticks * sweep.period_ms:g} ms){mark}"


def sweep_table(sweep: DelaySweep) -> list[str]:
    """Markdown: a row per delay, a success column per mode, the device's delay marked."""
    rows = ["| delay | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
    for d in sorted({p.ticks for p in sweep.points}):
        cells = [point_words(sweep.point(mode, d)) for mode in MODES]
        rows.append(f"| {delay_label(sweep, d)} | " + " | ".join(cells) + " |")
    return rows


def mark_lines(sweep: DelaySweep) -> list[str]:
    """Markdown: where real VLAs would sit on the curve (:attr:`DelaySweep.marks`), with
    their sources; nothing for a sweep without marks."""
    if not sweep.marks:
        return []
    return [
        "Where real VLAs would sit (inference p99 + the same margin, in ticks; dotted on the "
        "plot):",
        "",
        *(
            f"- {m.label}: {m.inference_ms:g} ms = {m.ticks} ticks ({m.source})"
            for m in sweep.marks
        ),
    ]


def write_sweep(sweep: DelaySweep, out: Path) -> Path:
    """``delay_sweep.md``, ``delay_sweep.png`` and ``delay_sweep.json`` into ``out``; returns
    the plot's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "delay_sweep.json").write_text(json.dumps(sweep.to_json(), indent=2))
    lines = [
        f"# Delay sweep: {sweep.policy}",
        "",
        f"Success on {sweep.seeds} seeds of each of {', '.join(sweep.variants)} (the same seeds "
        f"at every delay), 95% Wilson intervals; a chunk of {sweep.chunk_len} actions, "
        f"ticks of {sweep.period_ms:g} ms.",
        "",
        *sweep_table(sweep),
        "",
        f"The device's delay: {sweep.expected}." if sweep.expected else "",
        "",
        *mark_lines(sweep),
        "",
        "![success against delay](delay_sweep.png)",
        "",
    ]
    (out / "delay_sweep.md").write_text("\n".join(lines))
    return _plot(sweep, out / "delay_sweep.png")


def _plot(sweep: DelaySweep, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for mode, colour in zip(MODES, ("#c44e52", "#4c72b0"), strict=True):
        shown = [p for p in sweep.points if p.mode == mode and p.ci95 is not None]
        if not shown:
            continue
        x = [p.ticks for p in shown]
        y = [p.success_rate or 0.0 for p in shown]
        ci = [p.ci95 for p in shown if p.ci95 is not None]
        ax.plot(x, y, "o-", color=colour, label=mode)
        ax.fill_between(x, [lo for lo, _ in ci], [hi for _, hi in ci], color=colour, alpha=0.15)
    if sweep.expected_ticks is not None:
        ax.axvline(sweep.expected_ticks, ls="--", c="grey", label="the device's delay")
    for mark in sweep.marks:
        ax.axvline(mark.ticks, ls=":", c="#8c8c8c", lw=1)
        ax.text(mark.ticks, 1.02, f" {mark.label}", rotation=90, va="top", ha="right", size=6)
    ax.set_xticks(sorted({p.ticks for p in sweep.points}))
    ax.set_xlabel(f"inference delay, control ticks of {sweep.period_ms:g} ms")
    ax.set_ylabel("success (95% Wilson CI)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{sweep.policy}: {sweep.seeds} seeds per variant, the same at each delay")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
