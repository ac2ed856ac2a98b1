"""``robo-pipe models``: the MLflow model registry (list, show, promote, rollback, check)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pipelines import checks, registry
from pipelines.champion import champion_warning
from pipelines.cli.common import console, emit_json, load, quiet_prefect_console, services
from pipelines.cli.options import ConfigArg, JsonOpt, RayAddressOpt, SetOpt
from stages.register import may_promote

models = typer.Typer(
    help="The MLflow model registry: list, show, promote and roll back policy versions.",
    no_args_is_help=True,
)


@models.command("list")
def list_models(json_out: JsonOpt = False) -> None:
    """Registered models with their versions and aliases."""
    services()
    records = []
    warnings = []  # champions that did not pass the gates (MLflow's own alias editing)
    table = Table(title="registered models")
    for col in ("model", "versions", "champion", "candidate", "latest"):
        table.add_column(col)
    for name in registry.model_names():
        versions = registry.versions(name)
        by_alias = {a: v.version for v in versions for a in v.aliases}
        warning = champion_warning(name, versions)
        warnings += [warning] if warning else []
        table.add_row(
            name,
            str(len(versions)),
            by_alias.get(registry.CHAMPION, "-") + (" (!)" if warning else ""),
            by_alias.get(registry.CANDIDATE, "-"),
            versions[0].version if versions else "-",
        )
        records.append(
            {
                "name": name,
                "versions": [v.to_json() for v in versions],
                "champion_warning": warning,
            }
        )
    console.print(table)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    emit_json(records, json_out)


@models.command("show")
def show(
    model: Annotated[str, typer.Argument(help="NAME, NAME@ALIAS or NAME/VERSION.")],
    json_out: JsonOpt = False,
) -> None:
    """A model's versions, or one version's lineage and gate results."""
    services()
    if "@" in model or "/" in model:
        shown = [registry.get_version(*registry.parse_model_uri(model))]
    else:
        shown = registry.versions(model)
    for v in shown:
        table = Table(title=f"{v.name} v{v.version} {' '.join(v.aliases)}", show_header=False)
        table.add_row("registered", v.created)
        table.add_row("source", v.source)
        for key, value in sorted(v.tags.items()):
            table.add_row(key.removeprefix(registry.TAG), value)
        warning = champion_warning(v.name, [v])
        if warning:
            table.add_row("[yellow]warning[/]", warning)
        console.print(table)
    emit_json([v.to_json() for v in shown], json_out)


@models.command("promote")
def promote(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[str, typer.Argument(help="Version number (or alias) to make champion.")],
    force: Annotated[
        bool, typer.Option(help="Promote even if the version failed a gate (recorded in its tags).")
    ] = False,
) -> None:
    """Make a version the champion. Refused if it failed a gate, unless --force."""
    services()
    info = registry.get_version(model, version)
    allowed, failed = may_promote(info.tags, force)
    if not allowed:
        raise registry.RegistryError(
            f"{model} v{info.version} failed gates: {', '.join(failed)}; --force to promote anyway"
        )
    reason = "robo-pipe models promote" + (
        f" --force (failed {', '.join(failed)})" if failed else ""
    )
    info = registry.promote(model, info.version, reason)
    console.print(f"{model} v{info.version} is champion", highlight=False)


@models.command("rollback")
def rollback(model: Annotated[str, typer.Argument(help="Registered model name.")]) -> None:
    """Give the champion alias back to the previous champion."""
    services()
    info = registry.rollback(model)
    console.print(f"{model}: champion rolled back to v{info.version}", highlight=False)


@models.command("check")
def check(
    config: ConfigArg,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate the config's champion on its held-out suite (the champion_regression flow, as
    the hourly schedule runs it). Exits 1 if it fell below registry.promotion.min_success."""
    cfg = load(config, set_)  # read once: the flow takes it as it is
    checks.check_config(cfg)
    quiet_prefect_console()
    services(flows=True)
    if registry.champion(cfg.model_name) is None:
        raise registry.RegistryError(f"{cfg.model_name} has no champion to check")
    from pipelines.flow import RegressionDetected, champion_regression

    try:
        result = champion_regression(config=cfg, ray_address=ray_address)
    except RegressionDetected as err:
        console.print(f"[red]regression:[/] {err}", highlight=False)
        raise typer.Exit(code=1) from None
    console.print(
        f"[green]champion {result.model_name} v{result.version} holds[/]: held-out "
        f"success {result.measured}, required {result.required}",
        highlight=False,
    )
    emit_json(result, json_out)


def register(app: typer.Typer) -> None:
    """Add ``robo-pipe models`` to ``app``."""
    app.add_typer(models, name="models")
