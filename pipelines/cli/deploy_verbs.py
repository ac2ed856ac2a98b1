"""The deploy verbs: ``keys`` (signing keys, device tokens), ``bundle`` (a signed release of a
registry version), ``edge-agent`` (run the agent on a device), ``deploy`` (a version to a
device, or rolled out to a fleet), ``fleet status`` (what each device of a fleet runs)."""

from __future__ import annotations

import hashlib
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from deploy_edge.agent.config import Scope
from pipelines.cli.common import (
    console,
    emit_json,
    quiet_prefect_console,
    result_console,
    services,
)
from pipelines.cli.display import live, show_trials
from pipelines.cli.options import JsonOpt, ModelVersionArg, add_verb, epilog
from pipelines.deploy import release
from pipelines.registry.versions import get_version, parse_model_uri
from robo_pipe.errors import InputError

if TYPE_CHECKING:
    from deploy_edge.wire import Deployment
    from pipelines.records import FleetResult

keys = typer.Typer(
    help="Signing keys for releases, and bearer tokens for edge agents.",
    no_args_is_help=True,
    epilog=epilog(("robo-pipe keys generate", "robo-pipe keys token")),
)

KeyOpt = Annotated[
    Path | None,
    typer.Option(help="Ed25519 signing key (default $ROBO_PIPE_HOME/keys/robo-pipe.key)."),
]


def generate(
    out: Annotated[
        Path | None, typer.Option(help="Folder for the key pair (default $ROBO_PIPE_HOME/keys).")
    ] = None,
    name: Annotated[str, typer.Option(help="File name stem: NAME.key and NAME.pub.")] = "robo-pipe",
) -> None:
    """Make an Ed25519 key pair: NAME.key signs releases (keep it secret), NAME.pub goes into
    each device's trusted_keys. Refuses to overwrite an existing key."""
    from deploy_edge.keys import generate_keypair, key_id, load_public_key

    folder = out or release.default_key().parent
    private, public = generate_keypair(folder, name)
    shown = result_console(json_out=False)
    shown.print(f"signing key  {private} (mode 0600)", highlight=False)
    shown.print(
        f"public key   {public} (key id {key_id(load_public_key(public))}): add it to each "
        "device's trusted_keys",
        highlight=False,
    )


def token(
    scope: Annotated[
        Scope,
        typer.Option(
            help="What the token may do: read (status, history), deploy (also upload, deploy, "
            "activate, roll back), operate (also /episode, the policy server, --force)."
        ),
    ] = "deploy",
) -> None:
    """Make a bearer token for an edge agent: the token (printed on stdout) goes into the
    deploying machine's environment (the devices file names the variable); the YAML line with
    its sha256 goes under the device config's tokens. Scopes are ordered read < deploy <
    operate: each allows what the ones before it allow."""
    value = secrets.token_urlsafe(32)
    digest = hashlib.sha256(value.encode()).hexdigest()
    print(value)
    console.print(
        "paste under 'tokens:' in the device config (or add the hash to that scope's list):\n"
        f"  {scope}: [{digest}]",
        highlight=False,
        markup=False,
    )


def bundle(
    model: ModelVersionArg,
    key: KeyOpt = None,
    out: Annotated[Path | None, typer.Option(help="Release file (default under the home).")] = None,
    expires_in: Annotated[
        float, typer.Option(min=0.01, help="Days until the release expires on devices.")
    ] = 30.0,
    target: Annotated[
        list[str] | None,
        typer.Option(help="Target profile it may run on (repeatable; default any)."),
    ] = None,
    budget_ms: Annotated[
        float | None, typer.Option(help="p99 budget the device gates on (default its profile's).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write a signed release of a registry version: its export bundle and a manifest (model,
    version, run, every file's sha256, the I/O spec, targets, budget, expiry, release number)
    signed with an Ed25519 key. An agent accepts it only from a key it trusts."""
    services()
    version = get_version(*parse_model_uri(model))
    manifest, path = release.bundle_release(
        version, key or release.default_key(), out, expires_in, target or [], budget_ms
    )
    result_console(json_out).print(
        f"release {path} ({path.stat().st_size / 1e6:.1f} MB): {manifest.model_name} "
        f"v{manifest.model_version}, release {manifest.release}, {len(manifest.files)} files, "
        f"signed by {manifest.key_id}, expires {manifest.expires_at or 'never'}",
        highlight=False,
    )
    emit_json({"path": str(path), **manifest.to_json()}, json_out)


def edge_agent(
    config: Annotated[
        Path | None,
        typer.Option(
            "--device-config",
            help="Device config YAML (name, listen, state_dir, trusted_keys, tokens, target). "
            "Required.",
            show_default=False,
        ),
    ] = None,
    old_config: Annotated[Path | None, typer.Option("--config", hidden=True)] = None,
) -> None:
    """Run the edge agent on this device: an HTTP service that accepts signed releases from
    robo-pipe deploy, verifies, builds, gates and activates them, and rolls back on failure.
    Ctrl-C or SIGTERM stops it."""
    if old_config is not None or config is None:
        raise InputError(
            f"edge-agent takes its device config as --device-config {old_config or 'DEVICE.yaml'}"
            " (--config names a pipeline config, in the other verbs)"
        )
    from deploy_edge.agent.config import load_device_config
    from deploy_edge.agent.service import serve
    from pipelines.services.signals import interrupted_exit_code, stop_on_sigterm

    device = load_device_config(config)
    console.print(f"edge agent {device.name} on {device.listen}", highlight=False)
    # uvicorn stops on either signal, then raises it again under this process's handlers.
    stop_on_sigterm()
    try:
        serve(device)
    except KeyboardInterrupt as stopped:
        raise typer.Exit(code=interrupted_exit_code(stopped)) from None


def deploy(
    model: ModelVersionArg,
    device: Annotated[
        str | None,
        typer.Option("--device", help="Device name in the devices file.", show_default=False),
    ] = None,
    devices: Annotated[
        Path, typer.Option(help="Devices file: name, url, token_env, target per device.")
    ] = Path("devices.yaml"),
    fleet: Annotated[
        Path | None,
        typer.Option(help="Fleet file: devices with labels and the rollout policy (not --device)."),
    ] = None,
    canary: Annotated[
        int | None, typer.Option(min=0, help="Fleet: devices of the canary wave (default: file's).")
    ] = None,
    max_failures: Annotated[
        int | None,
        typer.Option(min=0, help="Fleet: failures a wave may have before the rollout stops."),
    ] = None,
    select: Annotated[
        list[str] | None,
        typer.Option(help="Fleet: only devices with this label, label=value (repeatable: all)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Fleet: print the waves and what each device runs; change nothing.")
    ] = False,
    max_parallel: Annotated[
        int | None,
        typer.Option(min=1, help="Fleet: most devices of a wave deployed at once (default all)."),
    ] = None,
    pause: Annotated[
        float | None,
        typer.Option(min=0, help="Fleet: seconds between waves (default: the file's pause_s)."),
    ] = None,
    retry_failed: Annotated[
        str | None,
        typer.Option(
            metavar="ROLLOUT",
            help="Fleet: only the devices that rollout (its id) did not leave on the version.",
        ),
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option(
            metavar="ROLLOUT",
            help="Fleet: go on with a stopped, cancelled or killed rollout: its devices not on "
            "the version yet.",
        ),
    ] = None,
    key: KeyOpt = None,
    force: Annotated[
        bool, typer.Option(help="Allow a downgrade or an expired release (recorded).")
    ] = False,
    systems_test: Annotated[
        bool,
        typer.Option(
            "--systems-test",
            help="A systems test: lets a random-weights version (built for measurements only) "
            "go live; the device records it. --device only.",
        ),
    ] = False,
    json_out: JsonOpt = False,
    old_target: Annotated[str | None, typer.Option("--target", hidden=True)] = None,
) -> None:
    """Deploy a registry version to a device: build and sign the release (or reuse it), upload
    it, and follow the agent's steps (verify, extract, engine, parity, latency gate, activate,
    health). Exits 0 only when the device runs the new version, 1 when it refused or rolled
    back (the reason is printed), 2 for bad input.

    With --fleet: roll it out to a fleet, a canary first, then waves (the devices of a wave at
    once); a wave with more failures than allowed stops the rollout and the devices it updated
    roll back to what they ran. Exits 0 only when every selected device runs the new version.

    The device runs what its target profile pins (fp32, fp16, int8, fp8), or with
    ``precision: auto`` the most accurate of the version's candidates that meets its budget
    there; the table says which and why the others do not. A version built with random weights
    deploys only with --systems-test."""
    from deploy_edge.device import connect, load_device
    from deploy_edge.wire import Origin

    fleet_only = {
        "--canary": canary,
        "--max-failures": max_failures,
        "--select": select or None,
        "--dry-run": dry_run or None,
        "--max-parallel": max_parallel,
        "--pause": pause,
        "--retry-failed": retry_failed,
        "--resume": resume,
    }
    if systems_test and fleet is not None:
        raise InputError("deploy: --systems-test applies to one --device, never to a fleet")
    parse_model_uri(model)  # a malformed version is bad input: before any work
    if old_target is not None:
        raise InputError(
            f"deploy names a device with --device {old_target} (--target is a target profile, "
            "in gate and bundle)"
        )
    if (device is None) == (fleet is None):
        raise InputError("deploy: give either --device NAME or --fleet FLEET.yaml (one of them)")
    if fleet is not None:
        knobs = _RolloutKnobs(canary, max_failures, max_parallel, pause, retry_failed, resume)
        _deploy_fleet(model, fleet, knobs, select or [], dry_run, key, force, json_out)
        return

    given = [name for name, value in fleet_only.items() if value is not None]
    if given:
        raise InputError(f"deploy: {', '.join(given)} only apply with --fleet")
    assert device is not None
    entry = load_device(devices, device)
    with connect(entry) as agent:  # an unreachable device or a missing token: before work
        agent.health()
    services()
    version = get_version(*parse_model_uri(model))
    manifest, path = release.bundle_release(version, key or release.default_key())
    with live(json_out) as display:
        done = release.deploy_release(
            entry, path, force, display, systems_test=systems_test, origin=Origin(by="cli")
        )
    table = Table(title=f"{entry.name}: {manifest.model_name} v{manifest.model_version}")
    for col in ("step", "result", "seconds"):
        table.add_column(col)
    for step in done.steps:
        verdict = "[green]ok" if step.ok else f"[red]FAILED: {step.detail}"
        table.add_row(step.name, verdict, f"{step.seconds:.2f}")
    out = result_console(json_out)
    out.print(table)
    if done.gate:
        gate = done.gate
        out.print(
            f"on-device latency ({gate.mode}): p50 {gate.p50_ms:.2f} ms, p99 {gate.p99_ms:.2f} "
            f"ms (budget {gate.budget_ms:g} ms), misses {int(gate.misses)}",
            highlight=False,
        )
        if gate.mode == "async":
            seam = "-" if gate.seam_jump_max is None else f"{gate.seam_jump_max:.4g}"
            out.print(
                f"async: inference p99 {gate.inference_p99_ms or 0:.2f} ms, action age p99 "
                f"{gate.action_age_p99_ms or 0:.2f} ms, largest seam jump {seam} (robot units)",
                highlight=False,
            )
    show_variants(done, out)
    if done.forced:
        console.print(f"[yellow]forced[/]: {', '.join(done.forced)}", highlight=False)
    if done.systems_test:
        console.print("[yellow]systems test[/]: recorded on the device", highlight=False)
    emit_json(done, json_out)
    if done.state != "active":
        console.print(f"[red]{entry.name} {done.state}[/]: {escape(done.reason)}", highlight=False)
        raise typer.Exit(code=1)
    runs = f" ({done.variant})" if done.variant else ""
    console.print(
        f"[green]{entry.name} runs {manifest.model_name} v{manifest.model_version}{runs}",
        highlight=False,
    )


def show_variants(done: Deployment, out: Console) -> None:
    """With ``precision: auto``: one row per way the device could run the bundle (its error
    relative to the action std, its on-device p99, chosen or why not), and the choice."""
    if not done.trials:
        return
    title = f"precision: auto, budget {done.gate.budget_ms:g} ms" if done.gate else ""
    show_trials(title, done.trials, done.choice, out, p99="on-device p99")


_STATE_STYLE = {"active": "green", "reverted": "yellow", "staged": "yellow", "planned": "cyan"}


@dataclass
class _RolloutKnobs:
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


def _deploy_fleet(
    model: str,
    fleet: Path,
    knobs: _RolloutKnobs,
    select: list[str],
    dry_run: bool,
    key: Path | None,
    force: bool,
    json_out: bool,
) -> None:
    """``deploy --fleet``: the plan (``--dry-run``) or the rollout, and its table."""
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
    version = get_version(*parse_model_uri(model))
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

        start_temporary_prefect_server()  # out of Ctrl-C's reach: the rollout records its end
        with live(json_out) as display, listening(display), rollout.stop_on_signals():
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
    """Say what the reconciliation of killed rollouts did (nothing when none was found)."""
    for line in lines:
        console.print(f"[yellow]repaired[/] {escape(line)}", highlight=False)


def show_rollout(result: FleetResult, out: Console) -> None:
    """One row per device: wave, before, after, state, reason, on-device p99."""
    title = f"{'plan: ' if result.dry_run else ''}{result.label} to {result.fleet}"
    table = Table(title=title)
    for col in ("device", "wave", "before", "after", "state", "reason", "on-device p99"):
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
        )
    out.print(table)


fleet_app = typer.Typer(
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
    add_verb(keys, generate, "robo-pipe keys generate", "robo-pipe keys generate --out keys/")
    add_verb(keys, token, "robo-pipe keys token")
    app.add_typer(keys, name="keys")
    add_verb(
        app,
        bundle,
        "robo-pipe bundle models:/demo-policy@champion",
        "robo-pipe bundle models:/demo-policy/3 --target jetson-orin-nano --expires-in 7",
    )
    add_verb(app, edge_agent, "robo-pipe edge-agent --device-config device.yaml")
    add_verb(
        app,
        deploy,
        "robo-pipe deploy models:/demo-policy@champion --device arm-1",
        "robo-pipe deploy demo-policy/3 --device arm-1 --devices lab-devices.yaml",
        "robo-pipe deploy models:/demo-policy@champion --fleet fleet.yaml --canary 1 --dry-run",
    )
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
