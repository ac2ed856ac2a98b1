"""The ``robo-pipe`` command line: one verb per job, each a thin layer over a step
(:mod:`pipelines.steps`) or a flow (:mod:`pipelines.run.flow`).

One grammar: a pipeline config is ``--config/-c PATH`` (default the shipped demo.yaml), a model
version ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` (one parser:
:func:`pipelines.registry.parse_model_ref`), a target profile ``--target``, a device
``--device``. A verb's result goes to stdout, progress and diagnostics to stderr; with
``--json`` stdout carries the result record alone.

Exit codes, the same for every verb (:data:`~pipelines.cli.options.EXIT_CODES`, at the end of
each --help): 0 done and every gate passed; 1 a verdict said no; 2 bad input (a
:class:`~robo_pipe.errors.RoboPipeError`: one line per problem, no traceback; usage errors too);
3 a failure of robo-pipe (the traceback is printed) or of a service it needs (a
:class:`~robo_pipe.errors.ServiceFailure`: its message names the service); 130 / 143
interrupted by SIGINT / SIGTERM.
"""

from __future__ import annotations

import sys
import traceback
from importlib.metadata import version
from typing import Annotated

import typer

from pipelines.cli import (
    assets_verbs,
    catalog,
    deploy_verbs,
    device_verbs,
    pipeline_verbs,
    registry_verbs,
    stage_verbs,
    verify_verbs,
)
from pipelines.cli.common import console
from pipelines.cli.options import epilog
from robo_pipe.errors import InputError, RoboPipeError, ServiceFailure

app = typer.Typer(
    name="robo-pipe",
    help=(
        "Train, simulate and deploy robot policies.\n\n"
        "State (runs, datasets, checkpoints, registry) lives in the home: $ROBO_PIPE_HOME, "
        "else the nearest .robo-pipe folder here or in a parent folder, else ./.robo-pipe "
        "(robo-pipe info says which). Configs are YAML files, given with --config (default: "
        "the shipped configs/demo.yaml); override any field with --set FIELD=VALUE."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Markdown: a docstring's single line breaks join into paragraphs that wrap to the
    # terminal (Typer's "rich" mode keeps them, breaking every line twice at 80 columns).
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every verb
    epilog=epilog(("robo-pipe run", "robo-pipe models list", "robo-pipe expert --episodes 10")),
)
for verbs in (
    stage_verbs,
    pipeline_verbs,
    registry_verbs,
    deploy_verbs,
    device_verbs,
    verify_verbs,
    assets_verbs,
    catalog,
):
    verbs.register(app)


def _print_version(wanted: bool) -> None:
    if wanted:
        print(f"robo-pipe {version('robo-pipe')}")
        raise typer.Exit()


@app.callback()
def root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Train, simulate and deploy robot policies."""


@app.command(
    "demo",
    hidden=True,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
def renamed_demo() -> None:
    """The scripted expert's verb before issue 35: says what it is called now."""
    raise InputError(
        "robo-pipe demo is now robo-pipe expert (the scripted expert); the whole pipeline is "
        "robo-pipe run (what make demo runs)"
    )


def report_user_error(err: RoboPipeError) -> int:
    """Print a user error, one line per problem, and return its exit code: 2, or 3 for a
    :class:`~robo_pipe.errors.ServiceFailure` (nothing in the input is wrong)."""
    for line in str(err).splitlines():
        console.print(f"[red]error:[/red] {line}", highlight=False, markup=True)
    return 3 if isinstance(err, ServiceFailure) else 2


def main() -> None:
    """Console entry point: the exit codes of the module docstring."""
    try:
        app()
    except RoboPipeError as err:
        sys.exit(report_user_error(err))
    except KeyboardInterrupt:  # outside a verb (Typer gives a verb's Ctrl-C 130 itself)
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        sys.exit(3)
