"""The options several verbs share (typer annotations), and what every verb's --help ends with:
its examples and the exit codes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from pipelines.steps.checks import PolicyKind, policy_kinds_help

if TYPE_CHECKING:
    from typer._click.core import Command, Context  # the click Typer vendors
    from typer._click.formatting import HelpFormatter

DEMO_CONFIG = Path("configs/demo.yaml")
"""The default config of every verb that takes one (shipped: found from any folder)."""

ConfigOpt = Annotated[
    Path,
    typer.Option(
        "--config",
        "-c",
        help="Pipeline config YAML: robot, scene, simulator, settings (a shipped one may be "
        "named without its folder: tiny.yaml).",
    ),
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
    bool,
    typer.Option(
        "--json", help="Print only the result record, as JSON, on stdout (the rest on stderr)."
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(help="Join this Ray cluster (e.g. auto or ray://head:10001); default local."),
]
ModelVersionArg = Annotated[
    str,
    typer.Argument(
        help="A registry version: models:/NAME@ALIAS or models:/NAME/VERSION (NAME@ALIAS and "
        "NAME/VERSION for short).",
        metavar="MODEL",
        show_default=False,
    ),
]


SHIPS_A_VERSION = (
    "An export or a checkpoint is refused (exit 2): a release is a registry version, numbered "
    "by it; robo-pipe run registers its export."
)
"""What bundle and deploy cannot take, and why (their POLICY help)."""


def policy_argument(accepts: tuple[PolicyKind, ...], why: str = "", metavar: str = "POLICY") -> Any:
    """The policy argument (``metavar``) of a verb that takes ``accepts`` (read by
    :func:`pipelines.steps.checks.resolve_policy`, the same in every verb); its help names
    them, and ``why`` what the verb cannot take and what to do instead."""
    return typer.Argument(
        help=f"{policy_kinds_help(accepts)[0].upper()}{policy_kinds_help(accepts)[1:]}. A path "
        f"that exists is read as one; NAME@ALIAS and NAME/N are versions otherwise. {why}".strip(),
        metavar=metavar,
        show_default=False,
    )


DevicesOpt = Annotated[
    Path | None,
    typer.Option(
        help="Devices file: name, url, token_env, target per device (default: devices.yaml "
        "here, else the home's edge/devices.yaml, which names the demo's local-agent).",
        show_default=False,
    ),
]
DEVICES_FILE = Path("devices.yaml")
"""The devices file a verb reads when --devices is not given and it exists here."""


def devices_file(given: Path | None) -> Path:
    """The devices file to read: ``given``; else :data:`DEVICES_FILE` here when it exists;
    else the home's (:func:`pipelines.deploy.local_agent.devices_file`, the demo's local agent)
    when it exists; else :data:`DEVICES_FILE` (whose absence the reader names)."""
    if given is not None:
        return given
    if DEVICES_FILE.is_file():
        return DEVICES_FILE
    from pipelines.deploy.local_agent import devices_file as home_devices

    home = home_devices()
    return home if home.is_file() else DEVICES_FILE


KeyOpt = Annotated[
    Path | None,
    typer.Option(help="Ed25519 signing key (default $ROBO_PIPE_HOME/keys/robo-pipe.key)."),
]

EXIT_CODES = """**Exit codes**

- **0** done, and every gate or check it ran passed
- **1** a verdict said no: a candidate blocked by a gate, a policy worse than its baseline, over \
the latency budget, a device that refused or rolled back, a fleet rollout stopped, a champion \
that regressed, a file that failed its checksum
- **2** bad input: the file, field or value is named, no traceback (usage errors too)
- **3** robo-pipe failed (a bug: the traceback is printed) or a service it needs did (a \
server, cluster or store that does not answer: named)
- **130** / **143** interrupted by Ctrl-C (SIGINT) / SIGTERM; completed stages are kept"""
"""The exit-code contract, the same for every verb (each verb's --help ends with it)."""


def epilog(examples: tuple[str, ...]) -> str:
    """The end of a verb's --help: its example commands, then :data:`EXIT_CODES`."""
    commands = "\n".join(examples)
    return f"**Examples**\n\n```\n{commands}\n```\n\n{EXIT_CODES}"


def bare_flags(command: Command, ctx: Context) -> None:
    """Show a flag in --help as its name alone: it takes no value, but typer 0.29's rich help
    prints its type (``--json <bool>``) unless it has a metavar, so give it an empty one."""
    for param in command.get_params(ctx):
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""


class VerbGroup(TyperGroup):
    """A group of verbs (the root, ``models``, ``devices``...): its flags print bare."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """typer's help, flags without a type (:func:`bare_flags`)."""
        bare_flags(self, ctx)
        super().format_help(ctx, formatter)


class Verb(TyperCommand):
    """A robo-pipe verb. A file given as a positional argument to a verb that takes it as an
    option (the grammar before issue 35: ``robo-pipe run configs/demo.yaml``) is refused
    naming the option to use, instead of click's "unexpected extra argument"."""

    FILE_OPTIONS = ("--config", "--device-config", "--fleet")
    """The options that name the file a verb is about (some once took it positionally)."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        """Parse as click does, after refusing a YAML file given positionally."""
        hint = self._positional_file_hint(ctx, args)
        if hint is not None:
            ctx.fail(hint)
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        """typer's help, flags without a type (:func:`bare_flags`)."""
        bare_flags(self, ctx)
        super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        """The usage line, less the hidden parameters (they only explain the old grammar)."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not getattr(param, "hidden", False):
                pieces += param.get_usage_pieces(ctx)
        return pieces

    def _positional_file_hint(self, ctx: Context, args: list[str]) -> str | None:
        shown = [p for p in self.params if not getattr(p, "hidden", False)]
        if any(p.param_type_name == "argument" for p in shown):
            return None  # its positional arguments are its own
        option = next((o for p in shown for o in p.opts if o in self.FILE_OPTIONS), None)
        # A YAML file right after an option is that option's value; anywhere else, positional.
        files = [
            arg
            for arg, before in zip(args, ["", *args], strict=False)
            if arg.endswith((".yaml", ".yml"))
            and not arg.startswith("-")
            and not before.startswith("-")
        ]
        if option is None or not files:
            return None
        return (
            f"{files[0]}: {ctx.command_path} takes this file as an option, not as an argument: "
            f"{ctx.command_path} {option} {files[0]}"
        )


def add_verb(
    app: typer.Typer, verb: Callable[..., Any], *examples: str, name: str | None = None
) -> None:
    """Add ``verb`` to ``app`` as the command ``name`` (default: the function's name, with
    dashes), its --help ending with ``examples`` and the exit codes."""
    command = name or verb.__name__.replace("_", "-")
    app.command(command, cls=Verb, epilog=epilog(examples))(verb)
