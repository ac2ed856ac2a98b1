"""A fleet rollout's summary: the markdown of the flow run's artifact, under one key per model."""

from __future__ import annotations

from pipelines.records import FleetResult
from robo_pipe.names import slug


def fleet_artifact_key(model: str) -> str:
    """The Prefect artifact key of ``model``'s rollout summaries."""
    return f"fleet-{slug(model) or 'model'}"


def summary_markdown(result: FleetResult) -> str:
    """The rollout as markdown: the verdict, then one table row per device."""
    verdict = (
        f"**cancelled** by {result.reason}; {result.rolled_back}"
        if result.cancelled_by
        else f"**stopped at wave {result.stopped_at_wave}**: {result.reason}; {result.rolled_back}"
        if result.stopped_at_wave is not None
        else "**complete**: every device runs it"
        if result.complete
        else "**done**, not every device runs it"
    )
    lines = [
        f"# Fleet rollout of {result.label}",
        "",
        f"Fleet `{result.fleet}`, {len(result.devices)} devices in {len(result.waves)} waves: "
        f"{verdict} ({result.seconds:.1f} s).",
        "",
        "| device | wave | before | after | state | reason | on-device p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result.devices:
        p99 = f"{row.p99_ms:.2f} ms" if row.p99_ms is not None else "-"
        reason = row.reason.replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {row.device} | {row.wave} | {row.before or '-'} | {row.after or '-'} | "
            f"{row.state} | {reason} | {p99} |"
        )
    return "\n".join(lines) + "\n"
