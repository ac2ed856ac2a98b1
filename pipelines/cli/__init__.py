"""The ``robo-pipe`` command line: one verb per job, each a thin layer over a step
(:mod:`pipelines.steps`) or a flow (:mod:`pipelines.run.flow`).

One grammar: a pipeline config is ``--config/-c PATH`` (default the shipped demo.yaml), a model
version ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` (one parser:
:func:`pipelines.registry.versions.parse_model_ref`), a target profile ``--target``, a device
``--device``. A verb's result goes to stdout, progress and diagnostics to stderr; with
``--json`` stdout carries the result record alone.

Exit codes, the same for every verb (:data:`~pipelines.cli.options.EXIT_CODES`, at the end of
each --help): 0 done and every gate passed; 1 a verdict said no; 2 bad input (a
:class:`~robo_pipe.errors.RoboPipeError`: one line per problem, no traceback; usage errors too);
3 a failure of robo-pipe (the traceback is printed) or of a service it needs (a
:class:`~robo_pipe.errors.ServiceFailure`: its message names the service); 130 / 143
interrupted by SIGINT / SIGTERM.

This module builds the app from the verb modules, each adding its verbs (``register``) in
the order --help lists them:

- ``demonstration_verbs``: expert, collect (the scripted expert's demonstrations)
- ``training_verbs``: pretrain, finetune
- ``evaluation_verbs``: evaluate (a policy in simulation, gated against a baseline)
- ``export_verbs``: export (a checkpoint to ONNX), gate (an export's latency)
- ``pipeline_verbs``: run (the whole flow), serve (its schedules), ui, info
- ``registry_verbs``: models list, show, promote, rollback, check
- ``release_verbs``: keys generate, token; bundle (a signed release)
- ``deploy_verbs``: edge-agent (a device's end), deploy (to a device; --fleet to a fleet)
- ``fleet_verbs``: deploy --fleet's rollout, fleet status, fleet rollback
- ``device_verbs``: devices status, history, activate, rollback, unstage, uploads, episode
- ``robot_verbs``: twin (the simulated arm as a ROS 2 robot)
- ``verify_verbs``: verify (files against their checksums)
- ``assets_verbs``: assets build (the robot's USD for Isaac Lab)
- ``catalog``: config, robots, scenes (what there is to choose from)

and what they share:

- ``common``: the consoles, loading a config, the services, a user error's report
- ``options``: the shared options, the --help epilog (examples, exit codes), ``add_verb``
- ``display``: the stages' live progress (rows in a terminal, lines in a log)
- ``result_tables``: the tables of a stage's record (checkpoint, evaluation, latency, trials,
  the pipeline's result)
- ``version_view``: a registry version as ``models show`` prints it (grouped, a terminal wide)
- ``__main__``: ``python -m pipelines.cli``
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
    demonstration_verbs,
    deploy_verbs,
    device_verbs,
    evaluation_verbs,
    export_verbs,
    fleet_verbs,
    pipeline_verbs,
    registry_verbs,
    release_verbs,
    robot_verbs,
    training_verbs,
    verify_verbs,
)
from pipelines.cli.common import report_user_error
from pipelines.cli.options import VerbGroup, epilog
from robo_pipe import collector
from robo_pipe.errors import InputError, RoboPipeError

app = typer.Typer(
    cls=VerbGroup,
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
for verbs in (  # in this order: --help lists the verbs, then the groups, as registered
    demonstration_verbs,
    training_verbs,
    evaluation_verbs,
    export_verbs,
    pipeline_verbs,
    registry_verbs,
    release_verbs,
    deploy_verbs,
    fleet_verbs,
    device_verbs,
    robot_verbs,
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


def main() -> None:
    """Console entry point: the exit codes of the module docstring."""
    collector.tune()
    try:
        app()
    except RoboPipeError as err:
        sys.exit(report_user_error(err))
    except KeyboardInterrupt:  # outside a verb (Typer gives a verb's Ctrl-C 130 itself)
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        sys.exit(3)
    finally:
        collector.skip_last_pass()
