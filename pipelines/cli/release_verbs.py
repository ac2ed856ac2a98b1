"""The verbs on releases and their credentials: ``keys`` (signing keys for releases, bearer
tokens for edge agents) and ``bundle`` (a signed release of a registry version)."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path
from typing import Annotated

import typer

from deploy_edge.agent.config import Scope
from pipelines.cli.common import console, emit_json, result_console, services
from pipelines.cli.options import (
    SHIPS_A_VERSION,
    JsonOpt,
    KeyOpt,
    VerbGroup,
    add_verb,
    epilog,
    policy_argument,
)
from pipelines.deploy import release
from pipelines.steps import checks

keys = typer.Typer(
    cls=VerbGroup,
    help="Signing keys for releases, and bearer tokens for edge agents.",
    no_args_is_help=True,
    epilog=epilog(("robo-pipe keys generate", "robo-pipe keys token")),
)


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
    model: Annotated[str, policy_argument(("registry",), SHIPS_A_VERSION, "MODEL")],
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
    policy = checks.resolve_policy(model, "bundle", ("registry",))  # bad input: before work
    services()
    version = policy.version()
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
