"""The deploy verbs: ``keys`` (signing keys, device tokens), ``bundle`` (a signed release of a
registry version), ``edge-agent`` (run the agent on a device), ``deploy`` (a version to a
device)."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipelines import release
from pipelines.cli.common import console, emit_json, services
from pipelines.cli.display import live
from pipelines.cli.options import JsonOpt

keys = typer.Typer(help="Signing keys for releases, and bearer tokens for edge agents.")

ModelUriArg = Annotated[
    str, typer.Argument(help="Registry version: models:/<name>@<alias> or models:/<name>/<n>.")
]
KeyOpt = Annotated[
    Path | None,
    typer.Option(help="Ed25519 signing key (default $ROBO_PIPE_HOME/keys/robo-pipe.key)."),
]


@keys.command("generate")
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
    console.print(f"signing key  {private} (mode 0600)", highlight=False)
    console.print(
        f"public key   {public} (key id {key_id(load_public_key(public))}): add it to each "
        "device's trusted_keys",
        highlight=False,
    )


@keys.command("token")
def token() -> None:
    """Make a bearer token for an edge agent: the token goes into the deploying machine's
    environment (the devices file names the variable), its sha256 into the device config."""
    value = secrets.token_urlsafe(32)
    print(value)
    console.print(f"token_sha256: {hashlib.sha256(value.encode()).hexdigest()}", highlight=False)


def bundle(
    model: ModelUriArg,
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
    manifest, path = release.bundle_release(
        model, key or release.default_key(), out, expires_in, target or [], budget_ms
    )
    console.print(
        f"release {path} ({path.stat().st_size / 1e6:.1f} MB): {manifest.model_name} "
        f"v{manifest.model_version}, release {manifest.release}, {len(manifest.files)} files, "
        f"signed by {manifest.key_id}, expires {manifest.expires_at or 'never'}",
        highlight=False,
    )
    emit_json({"path": str(path), **manifest.to_json()}, json_out)


def edge_agent(
    config: Annotated[Path, typer.Option("--config", help="Device config YAML.")],
) -> None:
    """Run the edge agent on this device: an HTTP service that accepts signed releases from
    robo-pipe deploy, verifies, builds, gates and activates them, and rolls back on failure.
    Ctrl-C or SIGTERM stops it."""
    from deploy_edge.agent.config import load_device_config
    from deploy_edge.agent.service import serve

    device = load_device_config(config)
    console.print(f"edge agent {device.name} on {device.listen}", highlight=False)
    serve(device)


def deploy(
    model: ModelUriArg,
    target: Annotated[str, typer.Option("--target", help="Device name in the devices file.")],
    devices: Annotated[
        Path, typer.Option(help="Devices file: name, url, token_env, target per device.")
    ] = Path("devices.yaml"),
    key: KeyOpt = None,
    force: Annotated[
        bool, typer.Option(help="Allow a downgrade or an expired release (recorded).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Deploy a registry version to a device: build and sign the release (or reuse it), upload
    it, and follow the agent's steps (verify, extract, engine, parity, latency gate, activate,
    health). Exits 0 only when the device runs the new version, 1 when it refused or rolled
    back (the reason is printed), 2 for bad input."""
    from deploy_edge.client import AgentClient, load_device

    entry = load_device(devices, target)
    with AgentClient(entry) as client:  # an unreachable device or a missing token: before work
        client.health()
    services()
    manifest, path = release.bundle_release(model, key or release.default_key())
    with live(json_out) as display:
        done = release.deploy_release(entry, path, force, display)
    table = Table(title=f"{entry.name}: {manifest.model_name} v{manifest.model_version}")
    for col in ("step", "result", "seconds"):
        table.add_column(col)
    for step in done.steps:
        verdict = "[green]ok" if step.ok else f"[red]FAILED: {step.detail}"
        table.add_row(step.name, verdict, f"{step.seconds:.2f}")
    console.print(table)
    if done.gate:
        console.print(
            f"on-device latency: p50 {done.gate['p50_ms']:.2f} ms, p99 {done.gate['p99_ms']:.2f} "
            f"ms (budget {done.gate['budget_ms']:g} ms), misses {int(done.gate['misses'])}",
            highlight=False,
        )
    if done.forced:
        console.print(f"[yellow]forced[/]: {', '.join(done.forced)}", highlight=False)
    emit_json(done, json_out)
    if done.state != "active":
        console.print(f"[red]{entry.name} {done.state}[/]: {done.reason}", highlight=False)
        raise typer.Exit(code=1)
    console.print(f"[green]{entry.name} runs {manifest.model_name} v{manifest.model_version}")


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    app.add_typer(keys, name="keys")
    app.command("bundle")(bundle)
    app.command("edge-agent")(edge_agent)
    app.command("deploy")(deploy)
