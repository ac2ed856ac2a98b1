"""``robo-pipe assets``: robot assets made from the robot's MJCF for other simulators (the USD
Isaac Lab loads), built in the Isaac Lab environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.common import emit_json, result_console
from pipelines.cli.options import JsonOpt, VerbGroup, add_verb, epilog
from robots.spec import get_robot
from sim_scenes.isaaclab.env import isaaclab_python

SOURCE_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding robo_pipe/, robots/ and sim_scenes/: the Isaac Lab environment imports
them from the checkout (robo-pipe is not installed there)."""

assets = typer.Typer(
    cls=VerbGroup,
    help="Robot assets for other simulators, made from the robot's MJCF.",
    no_args_is_help=True,
    epilog=epilog(("robo-pipe assets build",)),
)


def usd_dir(mjcf: Path) -> Path:
    """Where a robot's USD is kept: ``usd/`` beside its MJCF (committed)."""
    return mjcf.parent / "usd"


def build(
    robot: Annotated[
        str,
        typer.Option(
            help="A robot compiled from MJCF (robo-pipe robots lists them; a declared one, as "
            "sawyer, has no MJCF to convert)."
        ),
    ] = "rp5",
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write the USD here instead of robots/ROBOT/usd/ (the committed copy).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Convert the robot's MJCF to the USD Isaac Lab loads (robots/ROBOT/usd/MODEL.usda and
    Payload/), in the Isaac Lab environment (make isaaclab-env).

    The converter's output is fixed for Isaac Lab's Newton physics and renderer (gravity
    compensation, linear display colours, no site markers, joint limit softness) and every
    joint is checked against MuJoCo's (type, bodies, axis, anchor, limits); a mismatch exits
    2 and leaves the previous USD in place. The same MJCF gives byte-identical files.
    """
    mjcf = get_robot(robot).authored.mjcf
    out_dir = out if out is not None else usd_dir(mjcf)
    python = isaaclab_python()
    result = subprocess.run(
        [str(python), "-m", "sim_scenes.isaaclab.assets", str(mjcf), str(out_dir)],
        # Only the checkout: the main environment's own path entries are for Python 3.11.
        env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        # Its stderr: the refused build's problems (exit 2), or a traceback.
        sys.stderr.write(result.stderr)
        raise typer.Exit(code=result.returncode)
    files = result.stdout.splitlines()
    for file in files:
        result_console(json_out).print(f"wrote {_shown(Path(file))}", highlight=False)
    emit_json({"robot": robot, "usd": str(out_dir), "files": files}, json_out)


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory when it is below it (shorter to read)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        assets,
        build,
        "robo-pipe assets build",
        "robo-pipe assets build --robot rp5 --out /tmp/rp5-usd --json",
    )
    app.add_typer(assets, name="assets")
