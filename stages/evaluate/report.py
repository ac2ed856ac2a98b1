"""``EvalReport``: success with 95% Wilson intervals, per-variant rows, throughput, the seeds,
recorded episodes, and the comparison gate against a baseline (its statistics are
:mod:`stages.evaluate.comparison`'s); markdown and PNG renderings."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.home import mark_home
from robo_pipe.names import slug
from robo_pipe.records import Record
from sim_scenes.tasks import FailureMode, resolve_task
from stages.evaluate.comparison import Comparison
from stages.evaluate.delay import DelayPlan
from stages.evaluate.failures import breakdown, breakdown_line, measured
from stages.evaluate.language import PHRASING_LINES, LanguageBaselines, language_markdown
from stages.evaluate.shards import EpisodeOutcome, ShardOutcome
from stages.statistics import wilson_interval


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
    """Failed episodes by their task family's failure mode (:mod:`stages.evaluate.failures`)
    and, for a mode with a measure, its median and largest value (touch's near misses:
    ``near_miss_median_cm``, ``near_miss_max_cm``; absent without near misses). Empty in
    reports written before the breakdown existed."""


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
    phrasing: str = "trained"
    """How the instructions were worded (``evaluate.phrasing``): ``unseen`` results measure
    words no training instruction contains and are not comparable with ``trained`` ones."""
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    """Per episode: variant, index, seed, success, length, return, instruction, the values its
    task family records (``signals``: touch's closest approaches to the named object and to
    any other object and the final distance to the named one, m) and the failure mode (``""``
    if solved)."""
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
    delay: DelayPlan | None = None
    """The inference delay the policy played (None: none); the comparison is then with the
    policy at zero delay."""
    language: LanguageBaselines | None = None
    """Success where each instruction word is needed against ignoring it, and chance
    (:mod:`stages.evaluate.language`); None for a family without colour and shape words."""

    def successes_by_episode(self) -> dict[tuple[str, int], bool]:
        """(variant, seed index) -> success."""
        return {(o["variant"], o["index"]): bool(o["success"]) for o in self.outcomes}

    def failure_modes(self) -> tuple[FailureMode, ...]:
        """The failure modes of the evaluated task family (none without rows)."""
        return resolve_task(self.rows[0].variant)[0].failure_modes if self.rows else ()

    def why_failed(self) -> str:
        """The suite's failures in one line (``wrong object 3, near miss 12 (...), ...``)."""
        return breakdown_line(self.failure_modes(), self.failures)


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
        phrasing=facts["phrasing"],
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
    if not episodes:
        return {}
    modes = resolve_task(episodes[0].variant)[0].failure_modes
    return breakdown(modes, [e.failure for e in episodes], [e.signals for e in episodes])


def write_report(report: EvalReport, shards: list[ShardOutcome], out: Path, keep: int) -> None:
    """Write ``report.md``, ``success.png``, frame strips and ``eval_report.json`` into ``out``
    (fills ``report.report``, ``report.plot`` and ``report.recordings``)."""
    out.mkdir(parents=True, exist_ok=True)
    report.recordings = _write_strips(shards, out, keep)
    report.plot = str(_plot(report, out / "success.png"))
    report.report = str(out / "report.md")
    # Paths inside the robo-pipe home as $ROBO_PIPE_HOME/...: the home can move (robo_pipe.home).
    (out / "report.md").write_text(mark_home(markdown(report)))
    (out / "eval_report.json").write_text(json.dumps(mark_home(report.to_json()), indent=1))


def markdown(report: EvalReport) -> str:
    """The report as markdown: headline, per-variant table, gate, throughput, recordings."""
    low, high = report.ci95
    lines = [
        f"# Evaluation of `{report.policy}`",
        "",
        f"**Success {report.success_rate:.1%}** (95% CI {low:.1%}–{high:.1%}) over "
        f"{report.episodes} episodes, seeds from the `eval` stream of seed {report.seed}.",
        "",
        PHRASING_LINES[report.phrasing],
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
        lines += failures_markdown(report)
    if report.language:
        lines += language_markdown(report.language)
    if report.delay:
        lines += delay_markdown(report)
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


def failures_markdown(report: EvalReport) -> list[str]:
    """The "why episodes failed" section: a row per variant (and all), a column per failure
    mode of the task family, and one per mode's measure."""
    modes = report.failure_modes()
    heads = [m.label for m in modes] + [
        f"{m.label}: {m.measure_label}, median (max)" for m in modes if m.measure
    ]
    legend = "; ".join(f"{m.label}: {m.means}" for m in modes)
    lines = [
        "",
        "## Why episodes failed",
        "",
        f"By the task family's failure modes ({legend}).",
        "",
        "| variant | successes | " + " | ".join(heads) + " |",
        "|---|---:|" + "---:|" * len(heads),
    ]
    rows = [(r.variant, r.successes, r.failures) for r in report.rows]
    for name, wins, f in [*rows, ("all", report.successes, report.failures)]:
        cells = [str(int(f.get(m.name, 0))) for m in modes]
        cells += [measured(m, f) for m in modes if m.measure]
        lines.append(f"| {name} | {wins} | " + " | ".join(cells) + " |")
    return lines


def delay_markdown(report: EvalReport) -> list[str]:
    """The inference delay played and what it cost against zero delay on the same seeds."""
    d = report.delay
    assert d is not None
    lines = [
        "",
        f"## Inference delay: {d.mode}, {d.inference_ms:g} ms",
        "",
        f"Played as a robot whose inference takes time ({d.describe()}; "
        "`stages/evaluate/delay.py`).",
    ]
    c = report.comparison
    if c is not None:
        lines.append(
            f"Success {c.baseline_success_rate + c.difference:.1%} with the delay against "
            f"{c.baseline_success_rate:.1%} at zero delay on the same {c.table.seeds} episodes: "
            f"{c.difference:+.1%}, {c.decision} (the gate below)."
        )
    return lines


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


def rl_gain_words(gain: Comparison) -> str:
    """The paired test of RL's gain over its BC warm start in a few words: ``gain`` tested the
    warm start (its candidate) against the RL result (its baseline), so "worse" is a gain."""
    low, high = (-x for x in reversed(gain.difference_ci95))
    verdict = "significant" if gain.decision == "worse" else "not significant"
    return (
        f"paired: RL alone solved {gain.discordant['baseline_only']} seeds, the BC warm start "
        f"alone {gain.discordant['candidate_only']}; gain {-gain.difference:+.1%} (95% CI "
        f"{low:+.1%} to {high:+.1%}), {verdict} at {gain.confidence:.0%} (one-sided exact "
        f"McNemar p = {gain.p_value:.3g})"
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
    ax.set_title(
        f"{Path(report.policy).name}: {report.episodes} episodes, {report.phrasing} phrasings"
    )
    if panels == 2:
        _plot_outcomes(axes[1], report, names)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


SUCCESS_COLOUR = "#55a868"
FAILURE_COLOURS = ("#c44e52", "#dd8452", "#8c8c8c", "#8172b3", "#937860", "#da8bc3")
"""Colours of the outcome panel's failure modes, in their family's order."""


def _plot_outcomes(ax: Any, report: EvalReport, names: list[str]) -> None:
    """Each variant's episodes (and all of them) as one bar stacked by outcome, as shares."""
    rows = [(r.episodes, r.successes, r.failures) for r in report.rows]
    rows.append((report.episodes, report.successes, report.failures))
    bottom = np.zeros(len(names))
    outcomes = [("success", "success", SUCCESS_COLOUR)] + [
        (m.name, m.label, FAILURE_COLOURS[i % len(FAILURE_COLOURS)])
        for i, m in enumerate(report.failure_modes())
    ]
    for outcome, label, colour in outcomes:
        share = np.array(
            [
                (wins if outcome == "success" else f.get(outcome, 0.0)) / max(n, 1)
                for n, wins, f in rows
            ]
        )
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
                path = out / f"{slug(e.variant)}-{e.index:04d}-{label}.png"
                Image.fromarray(strip).save(path)
                paths.append(str(path))
    return paths
