"""The ``devices`` verbs: look after one edge device, named in a devices file (``--devices``) or
a fleet file (``--fleet``). ``status`` and ``history`` read it; ``activate``, ``rollback``
(``--to RELEASE``) and ``unstage`` change what it runs, each recorded in the device's history
as asked by the CLI; ``uploads`` lists or deletes the release files sent to it; ``episode`` runs
the active version on the device's robot once.

Exit codes, as ``deploy``'s: 0 done; 1 the device said no (nothing staged, nothing to roll back
to, not that release, the robot-busy lock) or an activation it rolled back; 2 bad input (an
unknown device, an unset token variable, a token it refuses); 3 the device does not answer.
No Prefect or MLflow is started: each verb is a few requests to the device's agent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipelines.cli.common import console, emit_json, result_console
from pipelines.cli.options import DevicesOpt, JsonOpt, VerbGroup, add_verb, devices_file, epilog
from robo_pipe.errors import InputError

if TYPE_CHECKING:
    from deploy_edge.device import Device, DeviceEntry
    from deploy_edge.wire import Deployment, Slot

devices_app = typer.Typer(
    cls=VerbGroup,
    help="One edge device: what it runs, its history, activate, rollback, unstage, uploads, "
    "an episode.",
    no_args_is_help=True,
    epilog=epilog(("robo-pipe devices status arm-1", "robo-pipe devices rollback arm-1")),
)

DeviceArg = Annotated[
    str,
    typer.Argument(help="Device name in the devices file (or the fleet file).", show_default=False),
]
FleetOpt = Annotated[
    Path | None,
    typer.Option(help="Take the device from this fleet file instead of the devices file."),
]


def find_device(name: str, devices: Path | None, fleet: Path | None) -> DeviceEntry:
    """The entry ``name``: from the fleet file when one is given, else the devices file
    (:func:`~pipelines.cli.options.devices_file`; bad input, naming the file and the devices
    it has, when it is not there)."""
    from deploy_edge.device import DeviceError, load_device
    from deploy_edge.fleet import load_fleet

    if fleet is None:
        return load_device(devices_file(devices), name)
    found = {d.name: d for d in load_fleet(fleet).devices}
    if name not in found:
        raise DeviceError(f"{fleet}: no device {name!r}; devices: {', '.join(found)}")
    return found[name]


def ask(entry: DeviceEntry, request: Callable[[Device], Deployment], json_out: bool) -> None:
    """Send one action (``request``, asked as the CLI) to the device and print its record:
    exit 0 when the device runs what was asked, 1 when it said no (its reason) or the action
    ended in any other state (a rolled-back activation)."""
    from deploy_edge.device import DeviceRefused, connect

    try:
        with connect(entry) as device:
            done = request(device)
    except DeviceRefused as err:
        console.print(f"[red]{entry.name}: no[/]: {escape(str(err))}", highlight=False)
        raise typer.Exit(code=1) from None
    out = result_console(json_out)
    show_history(f"{entry.name}: {done.state}", [done], out)
    emit_json(done, json_out)
    if done.state not in ("active", "rolled_back", "unstaged"):
        console.print(f"[red]{entry.name} {done.state}[/]: {escape(done.reason)}", highlight=False)
        raise typer.Exit(code=1)
    console.print(f"[green]{entry.name}[/]: {escape(done.reason or done.state)}", highlight=False)


def show_history(title: str, deployments: list[Deployment], out: Console) -> None:
    """One row per deployment: id, state, version, release, when, who asked, why."""
    table = Table(title=title)
    for col in ("id", "state", "version", "release", "finished", "by", "reason"):
        table.add_column(col)
    for d in deployments:
        origin = d.origin
        by = "-" if origin is None else origin.by + (f" {origin.rollout}" if origin.rollout else "")
        table.add_row(
            d.id,
            d.state,
            d.label,
            str(d.release),
            d.finished_at or "-",
            by,
            escape(d.reason),
        )
    out.print(table)


def status(
    device: DeviceArg,
    devices: DevicesOpt = None,
    fleet: FleetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What the device runs: its active, previous (the rollback target) and staged version,
    the robot-busy lock, the release floor, its last deployment and what an operator should
    know."""
    from deploy_edge.device import connect

    entry = find_device(device, devices, fleet)
    with connect(entry) as agent:
        now = agent.status()
    out = result_console(json_out)
    table = Table(title=f"{now.device} ({now.target})")
    for col in ("slot", "version", "release", "variant"):
        table.add_column(col)
    for name, slot in (("active", now.active), ("previous", now.previous), ("staged", now.staged)):
        table.add_row(name, *_slot_cells(slot))
    out.print(table)
    floor = ", ".join(f"{m} {r}" for m, r in now.floor.items()) or "none"
    out.print(
        f"robot-busy lock: {'set' if now.locked else 'free'}; floor: {floor}", highlight=False
    )
    if now.running is not None:
        out.print(f"running: {now.running.label} ({now.running.id})", highlight=False)
    if now.last is not None:
        last = now.last
        out.print(f"last: {last.label} {last.state} {escape(last.reason)}", highlight=False)
    for notice in now.notices:
        console.print(f"[yellow]notice[/]: {escape(notice)}", highlight=False)
    emit_json(now, json_out)


def episode(
    device: DeviceArg,
    devices: DevicesOpt = None,
    fleet: FleetOpt = None,
    ticks: Annotated[
        int, typer.Option(min=1, help="Control ticks at most (the robot may end it sooner).")
    ] = 100,
    instruction: Annotated[
        str | None,
        typer.Option(
            help="What to do (default: the task a simulated robot poses, else the "
            "device config's instruction).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """One episode of the active version on the device's robot, until the robot says it is
    done or --ticks: its outcome, latency and misses, and why the robot ended it (a ROS 2
    arm's lost topic or e-stop). Exits 1 unless it succeeded (a robot that cannot tell: 0)."""
    from deploy_edge.device import DeviceRefused, connect

    entry = find_device(device, devices, fleet)
    try:
        with connect(entry) as agent:
            done = agent.episode(instruction, ticks)
    except DeviceRefused as err:  # nothing active, or the robot cannot be reached
        console.print(f"[red]{entry.name}: no[/]: {escape(str(err))}", highlight=False)
        raise typer.Exit(code=1) from None
    out = result_console(json_out)
    outcome = {True: "success", False: "failure", None: "outcome unknown"}[done.success]
    out.print(
        f"{entry.name}: {done.version}: {outcome} in {done.ticks} ticks, p50/p99 "
        f"{done.p50_ms:.2f}/{done.p99_ms:.2f} ms, {done.misses} misses, {done.errors} errors",
        highlight=False,
    )
    if done.reason:
        out.print(f"ended by the robot: {escape(done.reason)}", highlight=False)
    emit_json(done, json_out)
    if done.success is False:
        raise typer.Exit(code=1)


def _slot_cells(slot: Slot | None) -> tuple[str, str, str]:
    if slot is None:
        return ("-", "-", "-")
    return (slot.label, str(slot.release), slot.variant or "-")


def history(
    device: DeviceArg,
    devices: DevicesOpt = None,
    fleet: FleetOpt = None,
    limit: Annotated[int, typer.Option(min=1, help="Show the newest N deployments.")] = 20,
    json_out: JsonOpt = False,
) -> None:
    """The device's deployments, newest first: state, version, who asked (cli, or a fleet
    and its rollout id) and why it ended as it did."""
    from deploy_edge.device import connect

    entry = find_device(device, devices, fleet)
    with connect(entry) as agent:
        done = agent.history()[:limit]
    show_history(f"history of {entry.name}", done, result_console(json_out))
    emit_json([d.to_json() for d in done], json_out)


def activate(
    device: DeviceArg,
    devices: DevicesOpt = None,
    fleet: FleetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Activate the staged version now (activate, health check, commit). Exits 1 when nothing
    is staged, the robot-busy lock is set, or its health check rolled it back."""
    from deploy_edge.wire import Origin

    entry = find_device(device, devices, fleet)
    ask(entry, lambda agent: agent.activate(origin=Origin(by="cli")), json_out)


def rollback(
    device: DeviceArg,
    devices: DevicesOpt = None,
    fleet: FleetOpt = None,
    to: Annotated[
        int | None,
        typer.Option(
            "--to",
            min=1,
            metavar="RELEASE",
            help="Roll back only if the previous version is this release (else exit 1, "
            "naming what the device holds).",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Back to the previous version, which becomes active. The device's rollback target is
    then none, never the version rolled back from (going further back is a deploy). Exits 1
    when there is no previous version or it is not --to's release."""
    from deploy_edge.wire import Origin

    entry = find_device(device, devices, fleet)
    ask(entry, lambda agent: agent.rollback(release=to, origin=Origin(by="cli")), json_out)


def unstage(
    device: DeviceArg,
    devices: DevicesOpt = None,
    fleet: FleetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Drop the staged version (deferred by the robot-busy lock): deleted from the device,
    never activated, recorded as unstaged. Exits 1 when nothing is staged."""
    from deploy_edge.wire import Origin

    entry = find_device(device, devices, fleet)
    ask(entry, lambda agent: agent.unstage(origin=Origin(by="cli")), json_out)


def uploads(
    device: DeviceArg,
    devices: DevicesOpt = None,
    fleet: FleetOpt = None,
    delete: Annotated[
        str | None,
        typer.Option(
            help="Delete the upload with this sha256 (partial or complete).", metavar="SHA"
        ),
    ] = None,
    delete_all: Annotated[bool, typer.Option("--all", help="Delete every upload.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """The release files sent to a device: sha256, bytes received of the declared size, age,
    complete or not (partial ones expire after the device's upload_max_age_h). --delete SHA or
    --all deletes (an upload being written or deployed is refused); the table shows what is
    left."""
    from deploy_edge.device import connect

    if delete is not None and delete_all:
        raise InputError("give --delete SHA or --all, not both")
    entry = find_device(device, devices, fleet)
    out = result_console(json_out)
    with connect(entry) as agent:
        doomed = [u.sha256 for u in agent.uploads()] if delete_all else [delete] if delete else []
        for sha256 in doomed:
            gone = agent.delete_upload(sha256)
            out.print(f"deleted {gone.sha256} ({gone.received} bytes)", highlight=False)
        left = agent.uploads()
    table = Table(title=f"uploads on {entry.name}")
    for col in ("sha256", "received", "size", "age", "state"):
        table.add_column(col)
    for u in left:
        table.add_row(
            u.sha256[:12],
            f"{u.received / 1e6:.1f} MB",
            f"{u.size / 1e6:.1f} MB" if u.size is not None else "-",
            f"{u.age_s / 3600:.1f} h",
            "[green]complete" if u.complete else "[yellow]partial",
        )
    out.print(table)
    emit_json([u.to_json() for u in left], json_out)


def renamed_device() -> None:
    """The group's name in issue 37: says what it is called now."""
    raise InputError("robo-pipe device is now robo-pipe devices (e.g. robo-pipe devices uploads)")


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        devices_app,
        status,
        "robo-pipe devices status arm-1 --devices lab-devices.yaml",
        "robo-pipe devices status arm-1 --fleet fleet.yaml --json",
    )
    add_verb(devices_app, history, "robo-pipe devices history arm-1 --limit 5")
    add_verb(devices_app, activate, "robo-pipe devices activate arm-1")
    add_verb(
        devices_app,
        rollback,
        "robo-pipe devices rollback arm-1",
        "robo-pipe devices rollback arm-1 --to 3",
    )
    add_verb(devices_app, unstage, "robo-pipe devices unstage arm-1")
    add_verb(
        devices_app,
        episode,
        "robo-pipe devices episode arm-1 --ticks 50",
        "robo-pipe devices episode arm-1 --instruction 'touch the red cube' --json",
    )
    add_verb(
        devices_app,
        uploads,
        "robo-pipe devices uploads arm-1 --devices lab-devices.yaml",
        "robo-pipe devices uploads arm-1 --delete 3f9a...e1",
        "robo-pipe devices uploads arm-1 --all",
    )
    app.add_typer(devices_app, name="devices")
    app.command(
        "device",
        hidden=True,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )(renamed_device)
