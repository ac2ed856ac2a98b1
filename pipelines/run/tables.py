"""The run summary's tables: evaluation, precision variants, latency and gates, as rows for a
Prefect table artifact and for the markdown (:mod:`pipelines.run.summary`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipelines.records import Evaluation

if TYPE_CHECKING:
    from deploy_edge.bundle.io_spec import Variant
    from deploy_edge.latency_report import LatencyReport
    from stages.export import ExportRef
    from stages.register import Gate


def percent(x: float) -> str:
    """``x`` as a percentage with one decimal: ``0.734`` -> ``73.4%``."""
    return f"{100 * x:.1f}%"


def interval(ci: list[float] | tuple[float, float]) -> str:
    """A 95% interval as the summary writes it: ``61.2% – 80.1%``."""
    return f"{percent(ci[0])} – {percent(ci[1])}"


def evaluation_table(evaluation: Evaluation) -> list[dict[str, Any]]:
    """One row per (policy, variant) with success and its 95% interval: the table artifact."""
    rows = []
    roles = (
        ("candidate", evaluation.candidate),
        ("BC warm start", evaluation.warm_start),
        ("start", evaluation.start),
    )
    for role, report in roles:
        if report is None:
            continue
        lines = [(r.variant, r.episodes, r.success_rate, r.ci95) for r in report.rows]
        lines.append(("all", report.episodes, report.success_rate, report.ci95))
        for variant, episodes, success, ci95 in lines:
            rows.append(
                {
                    "policy": role,
                    "variant": variant,
                    "episodes": episodes,
                    "success": percent(success),
                    "95% CI": interval(ci95),
                }
            )
    return rows


def export_variants(export: ExportRef) -> tuple[Variant, ...]:
    """The export's precision variants as its bundle's spec has them now (with the success
    test's figures, which the evaluation wrote after the export); the export record's when
    the bundle is gone."""
    from deploy_edge.bundle.io_spec import IOSpecError, read_io_spec

    try:
        return read_io_spec(export.path).variants
    except IOSpecError:
        return export.variants


def variants_table(variants: tuple[Variant, ...]) -> list[dict[str, str]]:
    """One row per variant: its error against FP32 (robot units and relative to the action
    std), its held-out success against FP32 on the same seeds when measured, and whether it
    may ship."""
    rows = []
    for v in variants:
        s = v.success
        success = (
            f"{percent(s['rate'])} vs {percent(s['fp32_rate'])} FP32, p {s['p_value']:.3g} "
            f"({s['episodes']:.0f} paired episodes)"
            if s
            else "not measured"
        )
        rows.append(
            {
                "variant": v.name,
                "mean abs error": f"{v.action_error:.1e}",
                "error / action std": f"{v.relative_error:.1%}",
                "held-out success": success,
                "ships": "yes" if v.candidate else f"NO: {v.reason}",
            }
        )
    return rows


def markdown_table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown table lines of ``rows`` (the first row's keys are the header)."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r[k] for k in head) + " |" for r in rows]


def latency_table(latency: LatencyReport) -> list[dict[str, Any]]:
    """The latency gate's figures as one table row (an ``async`` gate's own figures too)."""
    row: dict[str, Any] = {
        "target": latency.target,
        "result": "pass" if latency.passed else "FAIL",
        "p50 ms": round(latency.p50_ms, 2),
        "p95 ms": round(latency.p95_ms, 2),
        "p99 ms": round(latency.p99_ms, 2),
        "max ms": round(latency.max_ms, 2),
        "budget ms": latency.budget_ms,
        "misses": latency.misses,
    }
    if latency.mode == "async":
        row |= {
            "inference p99 ms": _rounded(latency.inference_p99_ms),
            "action age p99 ms": _rounded(latency.action_age_p99_ms),
            "largest seam jump": latency.seam_jump_max,
        }
    return [row]


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 2)


def gate_result(gate: Gate) -> str:
    """``pass``, ``FAIL``, or ``fail (not enforced)``."""
    return "pass" if gate.passed else ("FAIL" if gate.enforced else "fail (not enforced)")


def gates_table(gates: dict[str, Gate]) -> list[dict[str, str]]:
    """One row per promotion gate: its result, what was measured and what was required, as
    plain text a table cell shows as written (``>= 70%`` is a Markdown blockquote in a renderer
    that parses a cell on its own: it reads ``≥ 70%``)."""
    return [
        {
            "gate": name,
            "result": gate_result(gate),
            "measured": _plain(gate.measured),
            "required": _plain(gate.required),
        }
        for name, gate in gates.items()
    ]


def _plain(text: str) -> str:
    return text.replace(">=", "≥").replace("<=", "≤")
