"""``EvalReport``: success with 95% Wilson intervals, per-variant rows, throughput, the seeds,
recorded episodes, and the comparison gate against a baseline; markdown and PNG renderings."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.records import Record
from stages.evaluate.failures import breakdown
from stages.evaluate.sequential import (
    Decision,
    PairedTable,
    SequentialPlan,
    decide,
    detectable,
    p_value,
    paired_table,
    plan_looks,
)
from stages.evaluate.shards import EpisodeOutcome, ShardOutcome
from stages.statistics import paired_difference_interval, wilson_interval


@dataclass
class VariantRow(Record):
    """Results on one scene variant."""

    variant: str
    episodes: int
    successes: int
    success_rate: float
    ci95: tuple[float, float]
    mean_length: float
    failures: dict[str, float] = field(default_factory=dict)
    """Failed episodes by mode (:mod:`stages.evaluate.failures`) and the near misses' median
    and largest closest approach, cm (``near_miss_median_cm``, ``near_miss_max_cm``; absent
    without near misses). Empty in reports written before the breakdown existed."""


@dataclass
class Comparison(Record):
    """Candidate against baseline on the same seeds: paired, and sequential when planned so
    (:mod:`stages.evaluate.sequential`)."""

    baseline: str
    baseline_success_rate: float
    """On the seeds the comparison used."""
    baseline_ci95: tuple[float, float]
    difference: float
    """Candidate minus baseline success rate on those seeds."""
    difference_ci95: tuple[float, float]
    """Newcombe's paired 95% interval for :attr:`difference`."""
    test: str
    """``exact McNemar`` (one-sided, on the discordant seeds), or with a margin ``Newcombe
    paired interval``."""
    concordant: dict[str, int]
    """Seeds both solved (``both``) and both failed (``neither``)."""
    discordant: dict[str, int]
    """Seeds only the candidate solved (``candidate_only``) and only the baseline solved
    (``baseline_only``): the evidence."""
    p_value: float
    """The nominal one-sided exact McNemar p-value on the discordant counts where the
    comparison stopped: small means the candidate is worse."""
    boundary: float
    """The nominal level that p-value was held against at that look (the configured error
    rate itself in a fixed design)."""
    confidence: float
    """1 - the false-block rate over all looks."""
    margin: float
    """Regressions up to this (success-rate points) were tolerated."""
    decision: str
    """``worse`` or ``not worse``."""
    reason: str
    """Why the comparison stopped where it did."""
    seeds: int
    """Seeds per variant both policies were compared on."""
    max_seeds: int
    """The plan's maximum (``evaluate.episodes``)."""
    look: int
    """The look (1-based) that decided."""
    looks: list[int]
    """The plan: seeds per variant at each look (one entry: the fixed design)."""
    detectable_regression: float
    """The smallest regression (success-rate points) a fixed test at the false-block rate on
    these seeds catches with 80% power, at the discordance observed: what "not worse" can
    vouch for (a sequential look's own boundary is stricter)."""
    passed: bool
    """False only when the candidate is worse (by more than the margin)."""
    baseline_reused: int = 0
    """Baseline episodes taken from its stored outcomes instead of being played again."""
    played_on: int = 0
    """Seeds per variant the candidate played alone after the comparison decided "not worse",
    while its held-out success was undecided against the success gate's bar."""

    @property
    def table(self) -> PairedTable:
        """The 2x2 table of the compared seeds."""
        return PairedTable(
            self.concordant["both"],
            self.discordant["candidate_only"],
            self.discordant["baseline_only"],
            self.concordant["neither"],
        )


@dataclass
class EvalReport(Record):
    """What the evaluate stage hands on (JSON-serialisable)."""

    policy: str
    episodes: int
    successes: int
    success_rate: float
    ci95: tuple[float, float]
    rows: list[VariantRow]
    env_steps_per_s: float
    """Over the evaluation proper (wall time minus worker start-up)."""
    episodes_per_s: float
    wall_s: float
    startup_s: float
    """Starting the workers: loading the policy, building the simulators."""
    time_share: dict[str, float]
    """Share of worker time in simulate / render / inference."""
    workers: int
    replacements: int
    """Workers that died and were replaced (their shards re-run)."""
    seed: int
    seeds: list[int]
    """The seeds used, the same for every variant (``eval`` stream of ``seed``)."""
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    """Per episode: variant, index, seed, success, length, return, instruction, the closest
    approaches to the named object and to any other object and the final distance to the
    named object (m), and the failure mode (``""`` if solved)."""
    recordings: list[str] = field(default_factory=list)
    """Frame-strip PNGs of recorded successes and failures."""
    comparison: Comparison | None = None
    report: str = ""
    plot: str = ""
    failures: dict[str, float] = field(default_factory=dict)
    """Failed episodes of the whole suite by mode, as in :attr:`VariantRow.failures`."""
    nodes: dict[str, int] = field(default_factory=dict)
    """Episodes per Ray node that played them (``""``: this process, ``workers: 0``)."""
    baseline_outcomes: dict[str, str] = field(default_factory=dict)
    """With a comparison: the baseline's outcomes on the seeds compared, played or reused
    (:func:`stages.evaluate.sequential.encode_outcomes`), to be stored with it."""

    def successes_by_episode(self) -> dict[tuple[str, int], bool]:
        """(variant, seed index) -> success."""
        return {(o["variant"], o["index"]): bool(o["success"]) for o in self.outcomes}


def summarize(
    policy: str, shards: list[ShardOutcome], facts: dict[str, Any], seed: int
) -> EvalReport:
    """Merge shard outcomes into a report (no files written)."""
    episodes: list[EpisodeOutcome] = [e for s in shards for e in s.episodes]
    keys = [(e.variant, e.index) for e in episodes]
    if len(set(keys)) != len(keys):
        raise RuntimeError("an episode was counted twice")
    rows = []
    for variant in facts["variants"]:
        mine = [e for e in episodes if e.variant == variant]
        wins = sum(e.success for e in mine)
        rows.append(
            VariantRow(
                variant,
                len(mine),
                wins,
                wins / len(mine),
                wilson_interval(wins, len(mine)),
                float(np.mean([e.length for e in mine])),
                _failures(mine),
            )
        )
    wins = sum(e.success for e in episodes)
    timings: dict[str, float] = {}
    for s in shards:
        for k, v in s.timings.items():
            timings[k] = timings.get(k, 0.0) + v
    busy = sum(timings.values()) or 1.0
    wall = float(facts["wall_s"])
    running = max(1e-9, wall - float(facts["startup_s"]))
    return EvalReport(
        policy=policy,
        episodes=len(episodes),
        successes=wins,
        success_rate=wins / len(episodes),
        ci95=wilson_interval(wins, len(episodes)),
        rows=rows,
        env_steps_per_s=sum(e.length for e in episodes) / running,
        episodes_per_s=len(episodes) / running,
        wall_s=wall,
        startup_s=float(facts["startup_s"]),
        time_share={k: v / busy for k, v in timings.items()},
        workers=int(facts["workers"]),
        replacements=int(facts["replacements"]),
        seed=seed,
        seeds=list(facts["seeds"]),
        outcomes=[asdict(e) for e in episodes],
        failures=_failures(episodes),
        nodes=_episodes_per_node(shards),
    )


def _episodes_per_node(shards: list[ShardOutcome]) -> dict[str, int]:
    nodes: dict[str, int] = {}
    for shard in shards:
        nodes[shard.node] = nodes.get(shard.node, 0) + len(shard.episodes)
    return nodes


def _failures(episodes: list[EpisodeOutcome]) -> dict[str, float]:
    return breakdown([e.failure for e in episodes], [e.closest_target_distance for e in episodes])


def compare_outcomes(
    candidate: Mapping[tuple[str, int], bool],
    baseline: Mapping[tuple[str, int], bool],
    plan: SequentialPlan,
    look: int,
    verdict: tuple[Decision, str, float],
    baseline_name: str,
    baseline_reused: int = 0,
    played_on: int = 0,
) -> Comparison:
    """The comparison record of ``candidate`` and ``baseline`` outcomes ((variant, seed index)
    -> solved) on the seeds both played, decided at ``look`` of ``plan``: ``verdict`` is what
    :func:`~stages.evaluate.sequential.decide` said there (decision, why, block level);
    ``played_on``: see :attr:`Comparison.played_on`."""
    decision, reason, boundary = verdict
    if decision == "continue":
        raise ValueError("a comparison is recorded once it decided")
    table = paired_table(candidate, baseline)
    wins = table.both + table.baseline_only
    return Comparison(
        baseline=baseline_name,
        baseline_success_rate=wins / max(table.seeds, 1),
        baseline_ci95=wilson_interval(wins, table.seeds),
        difference=table.difference,
        difference_ci95=paired_difference_interval(
            table.both, table.candidate_only, table.baseline_only, table.neither, 0.95
        ),
        test="exact McNemar" if plan.margin <= 0 else "Newcombe paired interval",
        concordant={"both": table.both, "neither": table.neither},
        discordant={
            "candidate_only": table.candidate_only,
            "baseline_only": table.baseline_only,
        },
        p_value=p_value(table),
        boundary=boundary,
        confidence=1 - plan.false_block,
        margin=plan.margin,
        decision=decision,
        reason=reason,
        seeds=plan.looks[look],
        max_seeds=plan.looks[-1],
        look=look + 1,
        looks=plan.looks,
        detectable_regression=detectable(table, plan.false_block),
        passed=decision != "worse",
        baseline_reused=baseline_reused,
        played_on=played_on,
    )


def compare_fixed(
    candidate: Mapping[tuple[str, int], bool],
    baseline: Mapping[tuple[str, int], bool],
    seeds: int,
    confidence: float,
    margin: float,
    baseline_name: str,
) -> Comparison:
    """The fixed-design gate on outcomes ((variant, seed index) -> solved): is the candidate
    worse on its ``seeds`` seeds per variant? The baseline must have played every one."""
    if not candidate.keys() <= baseline.keys():
        raise ValueError("candidate and baseline were not evaluated on the same suite and seeds")
    theirs = {k: baseline[k] for k in candidate}
    plan = plan_looks(seeds, 1, 1 - confidence, 0.2, max(margin, 0.05), margin, "pocock")
    verdict = decide(plan, [paired_table(candidate, theirs)])
    return compare_outcomes(candidate, theirs, plan, 0, verdict, baseline_name)


def compare(
    candidate: EvalReport, baseline: EvalReport, confidence: float, margin: float = 0.0
) -> Comparison:
    """The fixed-design gate on two finished reports: is the candidate worse than the baseline
    on the candidate's seeds (the baseline must have played every one of them)?"""
    if [r.variant for r in candidate.rows] != [r.variant for r in baseline.rows] or (
        baseline.seeds[: len(candidate.seeds)] != candidate.seeds
    ):
        raise ValueError("candidate and baseline were not evaluated on the same suite and seeds")
    return compare_fixed(
        candidate.successes_by_episode(),
        baseline.successes_by_episode(),
        len(candidate.seeds),
        confidence,
        margin,
        baseline.policy,
    )


def write_report(report: EvalReport, shards: list[ShardOutcome], out: Path, keep: int) -> None:
    """Write ``report.md``, ``success.png``, frame strips and ``eval_report.json`` into ``out``
    (fills ``report.report``, ``report.plot`` and ``report.recordings``)."""
    out.mkdir(parents=True, exist_ok=True)
    report.recordings = _write_strips(shards, out, keep)
    report.plot = str(_plot(report, out / "success.png"))
    report.report = str(out / "report.md")
    (out / "report.md").write_text(markdown(report))
    (out / "eval_report.json").write_text(json.dumps(report.to_json(), indent=1))


def markdown(report: EvalReport) -> str:
    """The report as markdown: headline, per-variant table, gate, throughput, recordings."""
    low, high = report.ci95
    lines = [
        f"# Evaluation of `{report.policy}`",
        "",
        f"**Success {report.success_rate:.1%}** (95% CI {low:.1%}–{high:.1%}) over "
        f"{report.episodes} episodes, seeds from the `eval` stream of seed {report.seed}.",
        "",
        "| variant | episodes | successes | success | 95% CI | mean length |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in report.rows:
        lines.append(
            f"| {r.variant} | {r.episodes} | {r.successes} | {r.success_rate:.1%} | "
            f"{r.ci95[0]:.1%}–{r.ci95[1]:.1%} | {r.mean_length:.1f} |"
        )
    if report.failures:
        lines += [
            "",
            "## Why episodes failed",
            "",
            "Closest approaches of the tool centre point (`stages/evaluate/failures.py`): the "
            "wrong object (grounding), a near miss (execution: reached the object, not inside "
            "the success radius), a timeout (away from every object when time ran out).",
            "",
            "| variant | successes | wrong object | near miss | near miss: closest, median "
            "(max) | timeout |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        rows = [(r.variant, r.successes, r.failures) for r in report.rows]
        for name, wins, f in [*rows, ("all", report.successes, report.failures)]:
            median = f.get("near_miss_median_cm", math.nan)
            most = f.get("near_miss_max_cm", math.nan)
            closest = "–" if math.isnan(median) else f"{median:.1f} cm"
            closest += "" if math.isnan(most) else f" ({most:.1f} cm)"
            lines.append(
                f"| {name} | {wins} | {int(f.get('wrong_object', 0))} | "
                f"{int(f.get('near_miss', 0))} | {closest} | {int(f.get('timeout', 0))} |"
            )
    if report.comparison:
        lines += comparison_markdown(report.comparison)
    shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(report.time_share.items()))
    lines += [
        "",
        "## Throughput",
        "",
        f"{report.env_steps_per_s:,.0f} env-steps/s, {report.episodes_per_s:.1f} episodes/s, "
        f"{report.wall_s:.1f} s wall ({report.startup_s:.1f} s starting workers) on "
        f"{report.workers} worker(s) "
        f"({report.replacements} replaced). Worker time: {shares}.",
    ]
    if report.recordings:
        lines += ["", "## Recorded episodes", ""]
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in report.recordings]
    return "\n".join(lines) + "\n"


def comparison_line(c: Comparison) -> str:
    """The comparison in one line (the CLI, logs): decision, discordant seeds, p-value against
    its boundary, where it stopped and what it could detect."""
    return (
        f"{c.decision} than {c.baseline}: difference {c.difference:+.1%} on "
        f"{c.table.seeds} paired episodes (candidate only {c.discordant['candidate_only']}, "
        f"baseline only {c.discordant['baseline_only']}); {c.test} one-sided p = "
        f"{c.p_value:.4f} vs boundary {_boundary(c.boundary)}; look {c.look} of "
        f"{len(c.looks)}, {c.seeds} of {c.max_seeds} seeds per variant; catches a regression "
        f"of {c.detectable_regression:.1%} with 80% power"
        + (f"; the candidate played on {c.played_on} seeds per variant" if c.played_on else "")
    )


def _boundary(level: float) -> str:
    """A block level for people: 0 means no count of discordant seeds could block yet."""
    return f"{level:.4g}" if level > 0 else "0 (too few discordant seeds to block)"


def comparison_markdown(c: Comparison) -> list[str]:
    """The gate section: the paired table, the test, the one-sided p-value against its
    boundary, the decision and what the seeds used could detect."""
    verdict = "PASSED" if c.passed else "FAILED"
    t = c.table
    low, high = c.difference_ci95
    design = (
        f"sequential, {len(c.looks)} looks at {', '.join(map(str, c.looks))} seeds per variant"
        if len(c.looks) > 1
        else "fixed design"
    )
    lines = [
        "",
        f"## Gate against `{c.baseline}`: {verdict} ({c.decision})",
        "",
        f"Both policies on the same {c.seeds} seeds per variant ({t.seeds} episodes each; "
        f"{design}; stopped at look {c.look}: {c.reason}).",
        "",
        "| | baseline solved | baseline failed |",
        "|---|---:|---:|",
        f"| **candidate solved** | {t.both} | {t.candidate_only} |",
        f"| **candidate failed** | {t.baseline_only} | {t.neither} |",
        "",
        f"Candidate {c.baseline_success_rate + c.difference:.1%}, baseline "
        f"{c.baseline_success_rate:.1%}: difference {c.difference:+.1%} (95% CI {low:+.1%} to "
        f"{high:+.1%}, Newcombe's paired interval). {c.test}, one-sided: p = {c.p_value:.4f} "
        f"against the boundary {_boundary(c.boundary)} (false-block rate "
        f"{1 - c.confidence:.0%} over "
        f"all looks"
        + (f"; regressions up to {c.margin:.1%} tolerated" if c.margin > 0 else "")
        + ").",
        f"A fixed test on these seeds catches a regression of {c.detectable_regression:.1%} or "
        "more with 80% power; a smaller one can pass unseen.",
    ]
    if c.played_on:
        lines.append(
            f"The candidate alone played on {c.played_on} more seeds per variant (to "
            f"{c.seeds + c.played_on}): its held-out success was still undecided against the "
            "success gate's bar (the bar inside its 95% interval)."
        )
    if c.baseline_reused:
        lines.append(
            f"{c.baseline_reused} of the baseline's episodes were its stored outcomes (not "
            "played again)."
        )
    return lines


def _plot(report: EvalReport, path: Path) -> Path:
    """Success per variant with its interval and, when the report has the failure breakdown,
    beside it every variant's episodes stacked by outcome."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.variant for r in report.rows] + ["all"]
    rates = [r.success_rate for r in report.rows] + [report.success_rate]
    cis = [r.ci95 for r in report.rows] + [report.ci95]
    errors = np.array(
        [
            [p - lo for p, (lo, _) in zip(rates, cis, strict=True)],
            [hi - p for p, (_, hi) in zip(rates, cis, strict=True)],
        ]
    )
    panels = 2 if report.failures else 1
    width = 1.6 * len(names) + 2
    fig, axes = plt.subplots(1, panels, figsize=(width + (panels - 1) * (width + 1.5), 3.5))
    ax = axes[0] if panels == 2 else axes
    ax.bar(names, rates, yerr=errors, capsize=6, color=["#4c72b0"] * len(report.rows) + ["#55a868"])
    if report.comparison:
        ax.axhline(report.comparison.baseline_success_rate, ls="--", c="grey", label="baseline")
        ax.legend(loc="lower right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (95% Wilson CI)")
    ax.set_title(f"{Path(report.policy).name}: {report.episodes} episodes")
    if panels == 2:
        _plot_outcomes(axes[1], report, names)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


OUTCOME_COLOURS = {
    "success": "#55a868",
    "near_miss": "#dd8452",
    "wrong_object": "#c44e52",
    "timeout": "#8c8c8c",
}
"""Colours of the outcome panel: solved, then execution, grounding and other failures."""


def _plot_outcomes(ax: Any, report: EvalReport, names: list[str]) -> None:
    """Each variant's episodes (and all of them) as one bar stacked by outcome, as shares."""
    rows = [(r.episodes, r.successes, r.failures) for r in report.rows]
    rows.append((report.episodes, report.successes, report.failures))
    bottom = np.zeros(len(names))
    for outcome, colour in OUTCOME_COLOURS.items():
        share = np.array(
            [
                (wins if outcome == "success" else f.get(outcome, 0.0)) / max(n, 1)
                for n, wins, f in rows
            ]
        )
        label = outcome.replace("_", " ")
        ax.bar(names, share, bottom=bottom, color=colour, label=label)
        bottom += share
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of episodes")
    ax.set_title("outcomes (why episodes failed)")
    handles, labels = ax.get_legend_handles_labels()  # listed top to bottom, as stacked
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _write_strips(shards: list[ShardOutcome], out: Path, keep: int) -> list[str]:
    """Up to ``keep`` successes and ``keep`` failures per variant as frame-strip PNGs."""
    from PIL import Image

    paths = []
    for shard in shards:
        if not shard.frames:
            continue
        for wanted, label in ((True, "success"), (False, "failure")):
            picked = [e for e in shard.episodes if e.success == wanted][:keep]
            for e in picked:
                frames = shard.frames[e.index]
                step = max(1, len(frames) // 8)
                strip = np.concatenate(list(frames[::step][:8]), axis=1)
                path = out / f"{e.variant}-{e.index:04d}-{label}.png"
                Image.fromarray(strip).save(path)
                paths.append(str(path))
    return paths
