"""``robo-pipe models``: the MLflow model registry (list, show, promote, rollback, check)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pipelines.cli.common import (
    console,
    emit_json,
    load,
    quiet_prefect_console,
    read_registry,
    result_console,
    services,
)
from pipelines.cli.options import (
    DEMO_CONFIG,
    ConfigOpt,
    JsonOpt,
    ModelVersionArg,
    RayAddressOpt,
    SetOpt,
    VerbGroup,
    add_verb,
    epilog,
)
from pipelines.cli.version_view import show_tags, show_version, show_versions
from pipelines.registry import promotion
from pipelines.registry.champion import champion_warning
from pipelines.registry.versions import (
    CANDIDATE,
    CHAMPION,
    RegistryError,
    champion,
    get_version,
    model_names,
    parse_model_name,
    parse_model_ref,
    parse_model_uri,
    versions,
)
from pipelines.steps import checks
from robo_pipe.errors import InputError
from stages.register import may_promote

models = typer.Typer(
    cls=VerbGroup,
    help="The MLflow model registry: list, show, promote and roll back policy versions.",
    no_args_is_help=True,
    epilog=epilog(("robo-pipe models list", "robo-pipe models show models:/demo-policy@champion")),
)

ModelArg = Annotated[
    str,
    typer.Argument(
        help="A registered model: models:/NAME or NAME.", metavar="MODEL", show_default=False
    ),
]


def list_models(json_out: JsonOpt = False) -> None:
    """Registered models with their versions, champion and candidate."""
    missing = read_registry()
    if missing:
        console.print(missing, highlight=False)
        emit_json([], json_out)
        return
    records = []
    warnings = []  # champions that did not pass the gates (MLflow's own alias editing)
    table = Table(title="registered models")
    for col in ("model", "versions", "champion", "candidate", "latest"):
        table.add_column(col)
    for name in model_names():
        model_versions = versions(name)
        by_alias = {a: v.version for v in model_versions for a in v.aliases}
        warning = champion_warning(name, model_versions)
        warnings += [warning] if warning else []
        table.add_row(
            name,
            str(len(model_versions)),
            by_alias.get(CHAMPION, "-") + (" (!)" if warning else ""),
            by_alias.get(CANDIDATE, "-"),
            model_versions[0].version if model_versions else "-",
        )
        records.append(
            {
                "name": name,
                "versions": [v.to_json() for v in model_versions],
                "champion_warning": warning,
            }
        )
    result_console(json_out).print(table)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    emit_json(records, json_out)


def show(
    model: Annotated[
        str,
        typer.Argument(
            help="A registered model (models:/NAME or NAME: all its versions) or one version "
            "(models:/NAME@ALIAS, models:/NAME/VERSION, NAME@ALIAS or NAME/VERSION).",
            metavar="MODEL",
            show_default=False,
        ),
    ],
    all_tags: Annotated[
        bool, typer.Option("--all", help="Also every raw tag of each version, as stored.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """A model's versions (one row each), or one version grouped: its aliases and promotion,
    lineage, gate results, figures, its export (a local path, its precision variants, where a
    pretrained policy's encoder weights came from and their licence) and the devices it runs
    on. --all adds the raw tags (robo_pipe.*); --json is the full record."""
    name, which = parse_model_ref(model)  # bad input: before anything is read
    missing = read_registry()
    if missing:
        raise RegistryError(f"{model}: {missing}")
    shown = [get_version(name, which)] if which else versions(name)
    out = result_console(json_out)
    if which:
        show_version(shown[0], out)
    else:
        show_versions(name, shown, out)
    for v in shown if all_tags else []:
        show_tags(v, out)
    if warning := champion_warning(name, shown):
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    emit_json([v.to_json() for v in shown], json_out)


def promote(
    model: ModelVersionArg,
    force: Annotated[
        bool, typer.Option(help="Promote even if the version failed a gate (recorded in its tags).")
    ] = False,
    old_version: Annotated[str | None, typer.Argument(hidden=True)] = None,
) -> None:
    """Make a version the champion. Refused (exit 1) if it failed a gate, unless --force;
    refused always (exit 2) if its policy has random weights (a systems test)."""
    if old_version is not None:  # the grammar before issue 35: NAME VERSION
        raise InputError(
            f"models promote takes one argument, the version: models:/{model}/{old_version}"
        )
    name, which = parse_model_uri(model)
    missing = read_registry()
    if missing:
        raise RegistryError(f"{model}: {missing}")
    info = get_version(name, which)
    promotion.check_promotable(info)  # random weights: no --force gets past this
    allowed, failed = may_promote(info.tags, force)
    if not allowed:
        console.print(
            f"[red]refused:[/] {name} v{info.version} failed gates: {', '.join(failed)}; "
            "--force to promote anyway",
            highlight=False,
        )
        raise typer.Exit(code=1)
    reason = "robo-pipe models promote" + (
        f" --force (failed {', '.join(failed)})" if failed else ""
    )
    info = promotion.promote(name, info.version, reason)
    console.print(f"{name} v{info.version} is champion", highlight=False)


def rollback(model: ModelArg) -> None:
    """Give the champion alias back to the previous champion."""
    name = parse_model_name(model)
    missing = read_registry()
    if missing:
        raise RegistryError(f"{model}: {missing}")
    info = promotion.rollback(name)
    console.print(f"{name}: champion rolled back to v{info.version}", highlight=False)


def check(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate the config's champion on its held-out suite (the champion_regression flow, as
    the hourly schedule runs it). Exits 1 if it fell below registry.promotion.min_success.
    The verdict (holds, or the regression) is printed on stdout; progress and errors on
    stderr."""
    cfg = load(config, set_)  # read once: the flow takes it as it is
    checks.check_config(cfg)
    quiet_prefect_console()
    services(flows=True)
    if champion(cfg.model_name) is None:
        raise RegistryError(f"{cfg.model_name} has no champion to check")
    from pipelines.run.flow import RegressionDetected, champion_regression

    verdict = result_console(json_out)  # the verdict is the result: stdout, unless --json
    try:
        result = champion_regression(config=cfg, ray_address=ray_address)
    except RegressionDetected as err:
        verdict.print(f"[red]regression:[/] {err}", highlight=False)
        raise typer.Exit(code=1) from None
    verdict.print(
        f"[green]champion {result.model_name} v{result.version} holds[/]: held-out "
        f"success {result.measured}, required {result.required}",
        highlight=False,
    )
    emit_json(result, json_out)


def register(app: typer.Typer) -> None:
    """Add ``robo-pipe models`` to ``app``."""
    add_verb(
        models, list_models, "robo-pipe models list", "robo-pipe models list --json", name="list"
    )
    add_verb(
        models,
        show,
        "robo-pipe models show demo-policy",
        "robo-pipe models show models:/demo-policy@champion",
        "robo-pipe models show demo-policy/3 --all",
        "robo-pipe models show demo-policy/3 --json",
    )
    add_verb(
        models,
        promote,
        "robo-pipe models promote models:/demo-policy/3",
        "robo-pipe models promote demo-policy@candidate --force",
    )
    add_verb(models, rollback, "robo-pipe models rollback demo-policy")
    add_verb(
        models,
        check,
        "robo-pipe models check",
        "robo-pipe models check --config configs/tiny.yaml --json",
    )
    app.add_typer(models, name="models")
