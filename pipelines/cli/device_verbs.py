"""The ``device`` verbs: look after one edge device (``device uploads``: the release files sent
to it, listed or deleted)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipelines.cli.common import emit_json, result_console
from pipelines.cli.options import JsonOpt, add_verb, epilog
from robo_pipe.errors import InputError

device_app = typer.Typer(
    help="One edge device: what it holds.",
    no_args_is_help=True,
    epilog=epilog(("robo-pipe device uploads arm-1",)),
)

DeviceArg = Annotated[
    str, typer.Argument(help="Device name in the devices file.", show_default=False)
]
DevicesOpt = Annotated[
    Path, typer.Option(help="Devices file: name, url, token_env, target per device.")
]


def uploads(
    device: DeviceArg,
    devices: DevicesOpt = Path("devices.yaml"),
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
    from deploy_edge.device import connect, load_device

    if delete is not None and delete_all:
        raise InputError("give --delete SHA or --all, not both")
    entry = load_device(devices, device)
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


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        device_app,
        uploads,
        "robo-pipe device uploads arm-1 --devices lab-devices.yaml",
        "robo-pipe device uploads arm-1 --delete 3f9a...e1",
        "robo-pipe device uploads arm-1 --all",
    )
    app.add_typer(device_app, name="device")
