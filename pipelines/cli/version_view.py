"""``robo-pipe models show``: a registry version as people read it, in a terminal's width.

One version is one table grouped as a release engineer asks about it: the version (aliases,
when, promotion), its lineage, its gates, its figures, its export (a plain local path, its
precision variants, where its weights came from) and where it runs. A whole model is one row per
version. The raw tags are behind ``--all``; ``--json`` keeps the full record.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from rich.console import Console
from rich.table import Table

from pipelines.home import home_path
from pipelines.registry import tags as t
from pipelines.registry.versions import VersionInfo

TABLE_WIDTH = 96
"""Widest table, characters: the value column wraps to what the labels leave of it."""
HASH_CHARS = 12
"""A hash as shown (the full one is in ``--json``)."""

Rows = list[tuple[str, str]]


def export_path(v: VersionInfo) -> str:
    """Where ``v``'s export is, as a plain local path: the home's downloaded copy when there is
    one (:func:`pipelines.registry.exports.fetch_export`), else the registered artifact's
    folder (a ``file://`` location); an artifact on another store stays a URI."""
    fetched = home_path("exports") / "registry" / v.name / v.version
    if fetched.is_dir():
        return str(fetched)
    location = urlparse(v.source)
    if location.scheme == "file":
        return str(Path(unquote(location.path)))
    return v.source


def _short(value: str) -> str:
    return value[:HASH_CHARS] if value else "-"


def _version_rows(v: VersionInfo) -> Rows:
    tags = v.tags
    rows = [
        ("aliases", " ".join(v.aliases) or "-"),
        ("registered", f"{v.created}, run {v.run_id[:HASH_CHARS]}"),
    ]
    if promoted := tags.get(t.PROMOTED_AT_TAG):
        over = tags.get(t.PROMOTED_OVER_TAG)
        rows.append(("promoted", f"{promoted}{f' over v{over}' if over else ''}"))
        rows.append(("promoted by", tags.get(t.PROMOTED_BY_TAG, "-")))
    if rolled := tags.get(t.ROLLED_BACK_AT_TAG):
        rows.append(("rolled back", rolled))
    if v.random_weights:
        rows.append(("[yellow]weights[/]", "RANDOM: a systems test, never champion"))
    return rows


def _lineage_rows(v: VersionInfo) -> Rows:
    tags = v.tags
    base = tags.get(t.BASE_MODEL_TAG) or "none"
    if tags.get(t.BASE_HASH_TAG):
        base += f" ({_short(tags[t.BASE_HASH_TAG])})"
    return [
        ("dataset", _short(tags.get(t.DATASET_HASH_TAG, ""))),
        ("base", base),
        ("checkpoint", _short(tags.get(t.CHECKPOINT_HASH_TAG, ""))),
        ("onnx", _short(tags.get(t.ONNX_HASH_TAG, ""))),
        ("config", _short(tags.get(t.CONFIG_HASH_TAG, ""))),
        ("code", tags.get(t.CODE_VERSION_TAG) or "-"),
    ]


def _gate_rows(v: VersionInfo) -> Rows:
    rows = []
    for name, gate in v.gates.items():
        verdict = "[green]passed[/]" if gate.passed else "[red]FAILED[/]"
        advisory = "" if gate.enforced else " (advisory)"
        rows.append((name, f"{verdict}{advisory}: {gate.measured}; needs {gate.required}"))
    return rows or [("-", "none recorded")]


def _figure_rows(v: VersionInfo) -> Rows:
    tags, rows = v.tags, []
    if rate := tags.get(t.SUCCESS_RATE_TAG):
        rows.append(("held-out success", rate))
    if p99 := tags.get(t.LATENCY_P99_TAG):
        rows.append(("latency p99", f"{p99} ms"))
    if parameters := tags.get(t.PARAMETERS_TAG):
        rows.append(("parameters", parameters))
    if seconds := tags.get(t.EXPORT_SECONDS_TAG):
        rss = tags.get(t.EXPORT_PEAK_RSS_TAG)
        rows.append(("export cost", f"{seconds} s" + (f", peak RSS {rss} MiB" if rss else "")))
    if checked := tags.get(t.LAST_REGRESSION_AT_TAG):
        success = tags.get(t.LAST_REGRESSION_SUCCESS_TAG, "-")
        rows.append(("champion check", f"{success} at {checked}"))
    return rows


def _fields(tags: dict[str, str], prefix: str) -> dict[str, dict[str, str]]:
    """``<prefix><name>.<field>`` tags as name -> field -> value."""
    found: dict[str, dict[str, str]] = {}
    for key, value in tags.items():
        if key.startswith(prefix):
            name, _, field = key[len(prefix) :].rpartition(".")
            found.setdefault(name, {})[field] = value
    return dict(sorted(found.items()))


def _export_rows(v: VersionInfo) -> Rows:
    rows = [("path", export_path(v))]
    for name, f in _fields(v.tags, t.VARIANT_TAG).items():
        verdict = "candidate" if f.get("candidate") == "true" else f"not: {f.get('reason', '-')}"
        error = f.get("relative_error", "-")
        rows.append((f"{name} variant", f"{f.get('precision', '-')}, error {error}; {verdict}"))
    for role, f in _fields(v.tags, t.WEIGHTS_TAG).items():
        source = " ".join(filter(None, (f.get("package"), f.get("version"))))
        rows.append((f"{role} weights", f"{source or 'local file'}, {f.get('licence', '-')}"))
    return rows


def _device_rows(v: VersionInfo) -> Rows:
    rows = []
    for device, f in _fields(v.tags, t.DEVICE_TAG).items():
        runs = f.get("version", "-")
        p99 = f", p99 {f['p99_ms']} ms" if f.get("p99_ms", "-") != "-" else ""
        variant = f", {f['variant']}" if f.get("variant") else ""
        rows.append((device, f"{f.get('state', '-')} {runs} at {f.get('at', '-')}{p99}{variant}"))
    return rows or [("-", "no device")]


def show_version(v: VersionInfo, out: Console) -> None:
    """One version, grouped: version, lineage, gates, figures, export, where it runs."""
    groups = {
        "version": _version_rows(v),
        "lineage": _lineage_rows(v),
        "gates": _gate_rows(v),
        "figures": _figure_rows(v),
        "export": _export_rows(v),
        "runs on": _device_rows(v),
    }
    labels = max(len(f"  {label}") for rows in groups.values() for label, _ in rows)
    table = Table(title=f"{v.name} v{v.version}", show_header=False, title_justify="left")
    table.add_column("field", style="bold", no_wrap=True)
    # the borders and padding take 7 characters
    table.add_column("value", max_width=max(40, TABLE_WIDTH - 7 - labels), overflow="fold")
    for group, rows in groups.items():
        if not rows:
            continue
        table.add_section()
        table.add_row(f"[cyan]{group}[/]", "")
        for label, value in rows:
            table.add_row(f"  {label}", value)
    out.print(table)


def show_versions(name: str, versions: list[VersionInfo], out: Console) -> None:
    """A model: one row per version (aliases, when, gates, success, where it runs)."""
    table = Table(title=f"{name}: {len(versions)} versions", title_justify="left")
    for column in ("version", "aliases", "registered", "gates", "success", "runs on"):
        table.add_column(column, max_width=28, overflow="fold")
    for v in versions:
        failed = [n for n, g in v.gates.items() if not g.passed]
        gates = f"[red]failed {', '.join(failed)}[/]" if failed else "passed" if v.gates else "-"
        devices = [
            d for d, f in _fields(v.tags, t.DEVICE_TAG).items() if f.get("state") == "active"
        ]
        table.add_row(
            v.version,
            " ".join(v.aliases) or "-",
            v.created,
            gates,
            v.tags.get(t.SUCCESS_RATE_TAG, "-"),
            ", ".join(devices) or "-",
        )
    out.print(table)


def show_tags(v: VersionInfo, out: Console) -> None:
    """Every tag of ``v`` as it is stored (``--all``), the ``robo_pipe.`` prefix dropped."""
    table = Table(title=f"{v.name} v{v.version}: every tag", show_header=False)
    table.add_row("source", v.source)
    for key, value in sorted(v.tags.items()):
        table.add_row(key.removeprefix(t.TAG), value)
    out.print(table)
