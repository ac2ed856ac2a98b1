"""The verbs at the two ends of a deployment: ``edge-agent`` (run the agent on a device) and
``deploy`` (a registry version to a device; with ``--fleet``, rolled out to a fleet by
:func:`~pipelines.cli.fleet_verbs.deploy_fleet`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipelines.cli.common import console, emit_json, result_console, services
from pipelines.cli.display import live
from pipelines.cli.fleet_verbs import RolloutKnobs, deploy_fleet
from pipelines.cli.options import (
    SHIPS_A_VERSION,
    DevicesOpt,
    JsonOpt,
    KeyOpt,
    add_verb,
    devices_file,
    policy_argument,
)
from pipelines.cli.result_tables import show_trials
from pipelines.deploy import release
from pipelines.steps import checks
from robo_pipe.errors import InputError

if TYPE_CHECKING:
    from deploy_edge.wire import Deployment


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
    model: Annotated[str, policy_argument(("registry",), SHIPS_A_VERSION, "MODEL")],
    device: Annotated[
        str | None,
        typer.Option("--device", help="Device name in the devices file.", show_default=False),
    ] = None,
    devices: DevicesOpt = None,
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
    back (the reason is printed), 2 for bad input. A device that already runs this version
    with the same content is left alone: nothing is uploaded, one line says so, exit 0 (with
    --json the record of the deployment that made it active, "unchanged": true).

    With --fleet: roll it out to a fleet, a canary first, then waves (the devices of a wave at
    once); a wave with more failures than allowed stops the rollout and the devices it updated
    roll back to what they ran. Exits 0 only when every selected device runs the new version.

    The device runs what its target profile pins (fp32, fp16, int8, fp8), or with
    ``precision: auto`` the most accurate of the version's candidates that meets its budget
    there; the table says which and why the others do not. A version built with random weights
    deploys only with --systems-test."""
    from deploy_edge.device import connect, load_device
    from deploy_edge.wire import Origin
    from robo_pipe.integrity import file_sha256

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
    policy = checks.resolve_policy(model, "deploy", ("registry",))  # bad input: before work
    if old_target is not None:
        raise InputError(
            f"deploy names a device with --device {old_target} (--target is a target profile, "
            "in gate and bundle)"
        )
    if (device is None) == (fleet is None):
        raise InputError("deploy: give either --device NAME or --fleet FLEET.yaml (one of them)")
    if fleet is not None:
        knobs = RolloutKnobs(canary, max_failures, max_parallel, pause, retry_failed, resume)
        deploy_fleet(policy, fleet, knobs, select or [], dry_run, key, force, json_out)
        return

    given = [name for name, value in fleet_only.items() if value is not None]
    if given:
        raise InputError(f"deploy: {', '.join(given)} only apply with --fleet")
    assert device is not None
    entry = load_device(devices_file(devices), device)
    with connect(entry) as agent:  # an unreachable device or a missing token: before work
        agent.health()
    services()
    version = policy.version()
    manifest, path = release.bundle_release(version, key or release.default_key())
    sha256 = file_sha256(path)
    with connect(entry) as agent:  # what it runs already is not sent again
        running = release.already_running(agent, manifest, sha256)
    if running is not None:
        emit_json({**running.to_json(), "unchanged": True}, json_out)
        result_console(json_out).print(
            f"{entry.name} already runs {manifest.model_name} v{manifest.model_version} "
            f"(release {sha256[:12]}, the same content): nothing uploaded",
            highlight=False,
        )
        return
    with live(json_out) as display:
        done, sent = release.deploy_release(
            entry, path, force, display, systems_test=systems_test, origin=Origin(by="cli")
        )
    table = Table(title=f"{entry.name}: {manifest.model_name} v{manifest.model_version}")
    for col in ("step", "result", "seconds"):
        table.add_column(col)
    table.add_row("upload", sent.summary, f"{sent.seconds:.2f}")  # sent against the size
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


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(app, edge_agent, "robo-pipe edge-agent --device-config device.yaml")
    add_verb(
        app,
        deploy,
        "robo-pipe deploy models:/demo-policy@champion --device arm-1",
        "robo-pipe deploy demo-policy/3 --device arm-1 --devices lab-devices.yaml",
        "robo-pipe deploy models:/demo-policy@champion --fleet fleet.yaml --canary 1 --dry-run",
    )
