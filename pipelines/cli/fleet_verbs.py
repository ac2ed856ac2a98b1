"""The verbs on fleets of edge devices: ``deploy --fleet`` (a version rolled out in waves, a
canary first), ``fleet status`` (what each device of a fleet runs) and ``fleet rollback`` (a
rollout undone)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipelines.cli.common import (
    console,
    emit_json,
    quiet_prefect_console,
    result_console,
    services,
)
from pipelines.cli.display import live
from pipelines.cli.options import JsonOpt, VerbGroup, add_verb, epilog
from pipelines.steps.checks import PolicyArg
from robo_pipe.errors import InputError

if TYPE_CHECKING:
    from pipelines.records import FleetResult

_STATE_STYLE = {"active": "green", "reverted": "yellow", "staged": "yellow", "planned": "cyan"}


@dataclass
class RolloutKnobs:
    """How ``deploy --fleet`` rolls out, as given on the command line (None: the fleet
    file's policy)."""

    canary: int | None
    max_failures: int | None
    max_parallel: int | None
    pause_s: float | None
    retry_failed: str | None
    """A rollout id: only its devices not left on the version."""
    resume: str | None
    """A rollout id: its devices not on the version yet."""


def deploy_fleet(
    model: PolicyArg,
    fleet: Path,
    knobs: RolloutKnobs,
    select: list[str],
    dry_run: bool,
    key: Path | None,
    force: bool,
    json_out: bool,
) -> None:
    """``deploy --fleet``: the plan (``--dry-run``) or the rollout of the registry version
    ``model``, and its table."""
    quiet_prefect_console()
    from deploy_edge.fleet import check_tokens, load_selection
    from pipelines.deploy import followups, rollouts

    # Bad input fails here, in a second: nothing below (Prefect, MLflow, the flow's module)
    # is loaded or started before the fleet file, the tokens and the registry check out.
    if knobs.retry_failed is not None and knobs.resume is not None:
        raise InputError("deploy: give --retry-failed or --resume, not both")
    earlier, only = None, None
    if knobs.retry_failed is not None:
        earlier = rollouts.load(knobs.retry_failed)
        followups.check_same_rollout(earlier, fleet, None)
        only = followups.retry_devices(earlier)
    elif knobs.resume is not None:
        earlier = rollouts.load(knobs.resume)
        followups.check_same_rollout(earlier, fleet, None)
        only = followups.resume_devices(earlier)
        select = select or earlier.selectors
    _, chosen = load_selection(fleet, select)
    if only is not None:
        chosen = [d for d in chosen if d.name in only]
    check_tokens(chosen)
    services(flows=True)
    version = model.version()
    if earlier is not None:
        followups.check_same_rollout(earlier, fleet, f"{version.name}:{version.version}")
        if not chosen:
            console.print(
                f"[green]nothing to do[/]: every selected device of rollout {earlier.id} runs "
                f"{earlier.label}",
                highlight=False,
            )
            return
    from pipelines.deploy import fleet as rollout
    from pipelines.progress import listening

    repaired(followups.reconcile_rollouts())
    if dry_run:
        result = rollout.plan(version, fleet, knobs.canary, select)
    else:
        from pipelines.services.local_servers import start_temporary_prefect_server
        from pipelines.services.signals import sigterm_kept_in_flows

        start_temporary_prefect_server()  # out of Ctrl-C's reach: the rollout records its end
        # Prefect's flow engine would swap SIGTERM's handler for its own (an exception out of
        # the flow: no roll-back, exit 1): SIGTERM stays the rollout's stop request, as SIGINT.
        with (
            live(json_out) as display,
            listening(display),
            rollout.stop_on_signals(),
            sigterm_kept_in_flows(),
        ):
            result = rollout.roll_out(
                version=version,
                fleet=str(fleet),
                canary=knobs.canary,
                max_failures=knobs.max_failures,
                select=select,
                force=force,
                key=str(key) if key else None,
                max_parallel=knobs.max_parallel,
                pause_s=knobs.pause_s,
                only=only,
            )
    show_rollout(result, result_console(json_out))
    emit_json({**result.to_json(), "complete": result.complete}, json_out)
    if result.dry_run:
        return
    if result.cancelled_by:  # one line, then 130 / 143 as for any verb a signal stopped
        console.print(
            f"[red]rollout {result.rollout_id} cancelled[/] by {escape(result.reason)}; "
            f"{escape(result.rolled_back)}",
            highlight=False,
        )
        raise typer.Exit(code=128 + signal.Signals[result.cancelled_by])
    if result.stopped_at_wave is not None:
        console.print(
            f"[red]rollout stopped[/] at {escape(result.reason)}; {escape(result.rolled_back)}",
            highlight=False,
        )
        raise typer.Exit(code=1)
    if not result.complete:
        console.print(f"[red]not every device runs {result.label}", highlight=False)
        raise typer.Exit(code=1)
    console.print(f"[green]every device runs {result.label}[/] ({result.seconds:.1f} s)")


def repaired(lines: list[str]) -> None:
    """Say what the reconciliation of killed rollouts did, one line per device, each starting
    with ``repaired`` or ``not repaired yet:`` (nothing when none was found)."""
    for line in lines:
        style = "yellow" if line.startswith("repaired") else "red"
        console.print(f"[{style}]{escape(line)}", highlight=False)


def show_rollout(result: FleetResult, out: Console) -> None:
    """One row per device: wave, before, after, state, reason, on-device p99, MB sent."""
    title = f"{'plan: ' if result.dry_run else ''}{result.label} to {result.fleet}"
    table = Table(title=title)
    columns = ("device", "wave", "before", "after", "state", "reason", "on-device p99", "sent")
    for col in columns:
        table.add_column(col)
    for row in result.devices:
        style = _STATE_STYLE.get(row.state, "red")
        wave = f"{row.wave} (canary)" if row.wave == 0 and result.canary else str(row.wave)
        table.add_row(
            row.device,
            wave,
            row.before or "-",
            row.after or "-",
            f"[{style}]{row.state}",
            escape(row.reason),
            f"{row.p99_ms:.2f} ms" if row.p99_ms is not None else "-",
            f"{row.sent_bytes / 1e6:.1f} MB" if row.sent_bytes is not None else "-",
        )
    out.print(table)


fleet_app = typer.Typer(
    cls=VerbGroup,
    help="Fleets of edge devices: what each one runs; a rollout undone.",
    no_args_is_help=True,
    epilog=epilog(
        (
            "robo-pipe fleet status --fleet fleet.yaml",
            "robo-pipe fleet rollback fleet.yaml --rollout ID",
        )
    ),
)


def fleet_status(
    fleet: Annotated[
        Path,
        typer.Option(help="Fleet file (devices, labels, rollout policy).", show_default=False),
    ],
    select: Annotated[
        list[str] | None,
        typer.Option(help="Only devices with this label, label=value (repeatable: all)."),
    ] = None,
    expect: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL:VERSION",
            help="The version every selected device should run (default: that of the fleet "
            "file's last completed rollout in this home; none: only whether they answer).",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Each device's active and staged version, its last deployment and gate result, the
    robot-busy lock, and whether it answers (an unreachable device says why). Exits 0 when
    every selected device answers and runs the expected version, 1 when one does not (it is
    named), 2 for bad input. A rollout killed earlier (its process gone) is reconciled first:
    the devices it updated are rolled back and the lines say so."""
    from pipelines.deploy import followups, rollouts

    if expect is not None and not expect.partition(":")[2]:
        raise InputError(
            f"fleet status: --expect takes MODEL:VERSION, e.g. demo-policy:3 (got {expect!r})"
        )
    from pipelines.deploy import fleet as rollout

    if rollouts.dead():  # the registry's tags are repaired too: configure MLflow first
        services()
        repaired(followups.reconcile_rollouts())
    states = rollout.fleet_status(fleet, select or [])
    completed = rollouts.latest(fleet, state="completed")
    expected = expect or (completed.label if completed else None)
    table = Table(title=f"fleet {fleet}")
    for col in ("device", "reachable", "active", "staged", "last deployment", "last gate", "lock"):
        table.add_column(col)
    for s in states:
        last = f"{s.last_version} {s.last_state}" if s.last_state else "-"
        table.add_row(
            s.device,
            "[green]yes" if s.reachable else f"[red]no[/]: {escape(s.error)}",
            s.active or "-",
            s.staged or "-",
            last,
            escape(s.gate or "-"),
            "locked" if s.locked else "-",
        )
    result_console(json_out).print(table)
    emit_json([s.to_json() for s in states], json_out)
    down = [s.device for s in states if not s.reachable]
    elsewhere = [
        f"{s.device} ({s.active or 'nothing'})"
        for s in states
        if s.reachable and expected and s.active != expected
    ]
    if down or elsewhere:
        said = [f"unreachable: {', '.join(down)}"] if down else []
        said += [f"not on {expected}: {', '.join(elsewhere)}"] if elsewhere else []
        console.print(f"[red]{escape('; '.join(said))}", highlight=False)
        raise typer.Exit(code=1)
    runs = (
        f" and runs {expected}"
        if expected
        else " (no version expected: none given, no completed rollout)"
    )
    console.print(f"[green]every selected device answers{runs}", highlight=False)


def fleet_rollback(
    fleet: Annotated[Path, typer.Argument(help="Fleet file the rollout went to.")],
    rollout_id: Annotated[
        str,
        typer.Option(
            "--rollout", metavar="ID", help="The rollout to undo (its id).", show_default=False
        ),
    ],
    select: Annotated[
        list[str] | None,
        typer.Option(help="Only devices with this label, label=value (repeatable: all)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Return a fleet to what it ran before a rollout: each device that rollout put on its
    version rolls back to the version it ran before (the agent's rollback, recorded in its
    history with the rollout's id; the version's device tags say reverted). A device whose
    previous version is not that one is refused with the redeploy to run. Exits 0 when every
    such device runs what it ran before, 1 when some do not, 2 for bad input."""
    from deploy_edge.fleet import check_tokens, load_selection
    from pipelines.deploy import followups, rollouts

    record = rollouts.load(rollout_id)
    followups.check_same_rollout(record, fleet, None)
    _, chosen = load_selection(fleet, select or [])
    check_tokens(chosen)
    services()
    rows = followups.rollback_fleet(record, select or [])
    table = Table(title=f"fleet rollback of {record.label} ({record.id}) on {fleet}")
    for col in ("device", "was", "now", "state", "reason"):
        table.add_column(col)
    for row in rows:
        style = "yellow" if row.state == "reverted" else "red"
        table.add_row(
            row.device,
            row.before or "-",
            row.after or "-",
            f"[{style}]{row.state}",
            escape(row.reason),
        )
    result_console(json_out).print(table)
    emit_json({"rollout": record.id, "devices": [r.to_json() for r in rows]}, json_out)
    if not rows:
        console.print(
            f"nothing to roll back: no device runs {record.label} from rollout {record.id}",
            highlight=False,
        )
        return
    left = [r.device for r in rows if r.state != "reverted"]
    if left:
        console.print(
            f"[red]not rolled back[/]: {', '.join(left)} (see the reasons)", highlight=False
        )
        raise typer.Exit(code=1)
    console.print(
        f"[green]every device {record.id} updated runs what it ran before[/]", highlight=False
    )


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        fleet_app,
        fleet_status,
        "robo-pipe fleet status --fleet fleet.yaml",
        "robo-pipe fleet status --fleet fleet.yaml --select site=lab --json",
        name="status",
    )
    add_verb(
        fleet_app,
        fleet_rollback,
        "robo-pipe fleet rollback fleet.yaml --rollout 20261126T101601-3fa2c1",
        "robo-pipe fleet rollback fleet.yaml --rollout 20261126T101601-3fa2c1 --select site=lab",
        name="rollback",
    )
    app.add_typer(fleet_app, name="fleet")
