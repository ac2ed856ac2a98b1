"""The ``robo-pipe`` command line: one verb per job, each a thin layer over a step
(:mod:`pipelines.steps`) or a flow (:mod:`pipelines.flow`).

Every verb that produces something accepts ``--json`` and then prints its result record as one
JSON line, last. A mistake in the input (a :class:`~robo_pipe.errors.RoboPipeError`: config
field, path, model URI, target, corrupt dataset or bundle) prints one line per problem and
exits 2; anything else is a bug in robo-pipe and shows its traceback (exit 1).
"""

from __future__ import annotations

import sys

import typer

from pipelines.cli import (
    assets_verbs,
    catalog,
    deploy_verbs,
    pipeline_verbs,
    registry_verbs,
    stage_verbs,
    verify_verbs,
)
from pipelines.cli.common import console
from robo_pipe.errors import RoboPipeError

app = typer.Typer(
    name="robo-pipe",
    help=(
        "Train, simulate and deploy robot policies.\n\n"
        "State (runs, datasets, checkpoints, registry) lives under $ROBO_PIPE_HOME "
        "(default ./.robo-pipe). Configs are YAML files (the shipped ones: configs/demo.yaml, "
        "configs/demo-wrist.yaml); override any field with --set FIELD=VALUE."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Markdown: a docstring's single line breaks join into paragraphs that wrap to the
    # terminal (Typer's "rich" mode keeps them, breaking every line twice at 80 columns).
    rich_markup_mode="markdown",
)
for verbs in (
    stage_verbs,
    pipeline_verbs,
    registry_verbs,
    deploy_verbs,
    verify_verbs,
    assets_verbs,
    catalog,
):
    verbs.register(app)


def report_user_error(err: RoboPipeError) -> int:
    """Print a user error, one line per problem, and return the exit code (2)."""
    for line in str(err).splitlines():
        console.print(f"[red]error:[/red] {line}", highlight=False, markup=True)
    return 2


def main() -> None:
    """Console entry point: user errors exit 2 without a traceback; bugs keep theirs."""
    try:
        app()
    except RoboPipeError as err:
        sys.exit(report_user_error(err))
