"""The options several verbs share (typer annotations)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigArg = Annotated[Path, typer.Argument(help="Pipeline config YAML, e.g. configs/demo.yaml.")]
ConfigOpt = Annotated[
    Path, typer.Option("--config", help="Pipeline config: robot, scene, simulator, settings.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a config field, FIELD=VALUE with VALUE parsed as YAML "
        "(e.g. --set sim.num_envs=32). Repeatable.",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the result record as JSON on the last line.")
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(help="Join this Ray cluster (e.g. auto or ray://head:10001); default local."),
]
DEMO_CONFIG = Path("configs/demo.yaml")
