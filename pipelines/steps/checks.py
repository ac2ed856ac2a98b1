"""Checks of a command's inputs, run before any work starts (a typo must not cost a pretraining
run). Each raises a :class:`~robo_pipe.errors.RoboPipeError` that names the input: the CLI
prints it and exits 2; the flow fails before its first stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deploy_edge.bundle.layout import IO_SPEC_FILE, bundle_root
from pipelines.config import PipelineConfig
from pipelines.registry.exports import fetch_export
from pipelines.registry.versions import (
    MODEL_URI_FORMS,
    RegistryError,
    VersionInfo,
    get_version,
    parse_model_uri,
)
from robo_pipe.errors import InputError
from stages.policy.types import policy_type


def check_config(cfg: PipelineConfig) -> None:
    """What a whole pipeline run needs beyond a valid config: the latency target profile, the
    fleet file and its tokens, the weights the policy type loads (its
    :meth:`~stages.policy.types.PolicyType.check_inputs`: a hub-vlm backbone on disk, a pretrained
    policy's encoder weights), the Isaac Lab environment when the simulator is Isaac Lab, and
    no ``evaluate.delay`` (a delayed evaluation is compared with the policy itself at zero
    delay, not with the champion: it is ``robo-pipe evaluate``'s, and a run's gates judge the
    candidate as it plays at zero delay). Raises before any stage runs."""
    from deploy_edge.targets import load_target

    load_target(cfg.latency.target)
    delay = cfg.evaluate.delay
    if delay.inference_ms > 0 or delay.latency_report is not None:
        given = (
            f"inference_ms = {delay.inference_ms:g}"
            if delay.inference_ms > 0
            else f"latency_report = {delay.latency_report!r}"
        )
        raise InputError(
            f"field 'evaluate.delay.{given}': a pipeline run evaluates its candidate at zero "
            "delay against the champion; measure what a delay costs with robo-pipe evaluate "
            "POLICY --delay-ms MS"
        )
    check_simulator(cfg)
    if cfg.deploy.fleet:  # the rollout at the end must not fail on a typo after hours
        from deploy_edge.fleet import check_tokens, load_selection

        check_tokens(load_selection(cfg.deploy.fleet)[1])
    policy_type(cfg.policy.type).check_inputs(cfg.policy)


def check_simulator(cfg: PipelineConfig) -> None:
    """The configured simulator backend can start: Isaac Lab needs its own environment."""
    from sim_scenes.backends import check_backend

    check_backend(cfg.sim)


def check_out_dir(path: Path, what: str) -> None:
    """``path`` can become (or already is) a directory: it is not a file, nor under one."""
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{what} {path}: {parent} is a file, not a directory")
            return


def check_dataset(path: Path) -> None:
    """``path`` is a readable LeRobot v3 dataset (its metadata and episodes; no decoding)."""
    from stages.dataset.reader import open_dataset

    open_dataset(path, check_videos=False)


def check_checkpoint(path: Path) -> None:
    """``path`` is a robo-pipe checkpoint directory."""
    from stages.policy.checkpoint import read_policy_meta

    read_policy_meta(path)


def check_export(path: Path) -> None:
    """``path`` is an export bundle (its I/O spec reads and is of a known format)."""
    from deploy_edge.bundle.io_spec import read_io_spec

    read_io_spec(path)


def check_policy(cfg: PipelineConfig, policy: Path) -> None:
    """``policy`` (checkpoint or export) exists and fits ``cfg``'s robot."""
    from stages.evaluate import check_policy_fits

    check_policy_fits(policy, cfg.robot)


PolicyKind = Literal["registry", "export", "checkpoint"]
"""What a policy argument names: a registry version, an export (ONNX bundle) or a checkpoint."""

POLICY_KINDS: dict[PolicyKind, str] = {
    "registry": f"a registry version ({MODEL_URI_FORMS})",
    "export": "an export (its folder, or its .onnx file)",
    "checkpoint": "a checkpoint folder (policy.json inside)",
}
"""How each kind is written, in every verb's --help and error."""


@dataclass(frozen=True)
class PolicyArg:
    """A policy as a verb was given it (:func:`resolve_policy`): what it is, and where."""

    given: str
    kind: PolicyKind
    model: tuple[str, str] | None = None
    """A registry version's (name, version number or alias); None for a path."""

    def path(self) -> Path:
        """The folder (or .onnx file) to load: the path given, or the registry version's
        export downloaded into the home (:func:`~pipelines.registry.exports.fetch_export`,
        once; verified)."""
        if self.model is None:
            return Path(self.given)
        return fetch_export(*self.model)[1]

    def version(self) -> VersionInfo:
        """The registry version (its number resolved from an alias)."""
        assert self.model is not None, "only a registry version has one"
        return get_version(*self.model)


def policy_kinds_help(accepts: tuple[PolicyKind, ...]) -> str:
    """``accepts`` as a --help sentence: "a registry version (...) or an export (...)"."""
    named = [POLICY_KINDS[kind] for kind in accepts]
    return ", ".join(named[:-1]) + (" or " if len(named) > 1 else "") + named[-1]


def resolve_policy(text: str, verb: str, accepts: tuple[PolicyKind, ...]) -> PolicyArg:
    """What ``text``, the policy given to ``verb``, names: the one reading of a policy argument
    in every verb. A path that exists is a checkpoint (``policy.json`` inside) or an export
    (``io_spec.json`` in it, or beside its ``.onnx`` file); anything else is a registry version
    (``models:/NAME@ALIAS``, ``models:/NAME/N``, or ``NAME@ALIAS`` / ``NAME/N`` when no such
    path exists). Raises an :class:`~robo_pipe.errors.InputError` (exit 2) for a path that is
    neither, a malformed version, or a kind ``verb`` cannot use, saying what to pass instead.
    Nothing is read from the registry yet (:meth:`PolicyArg.path`, :meth:`PolicyArg.version`)."""
    path = Path(text)
    if not text.startswith("models:") and path.exists():
        if (path / "policy.json").is_file():
            found = PolicyArg(text, "checkpoint")
        elif (bundle_root(path) / IO_SPEC_FILE).is_file():
            found = PolicyArg(text, "export")
        else:
            raise InputError(
                f"{text}: not a policy: neither a checkpoint (no policy.json) nor an export (no "
                f"{IO_SPEC_FILE}); {verb} takes {policy_kinds_help(accepts)}"
            )
    elif text.startswith("models:"):  # a malformed one: the parser names the forms
        found = PolicyArg(text, "registry", parse_model_uri(text))
    else:
        try:
            found = PolicyArg(text, "registry", parse_model_uri(text))
        except RegistryError:
            raise InputError(
                f"{text}: no such file or folder, and not a registry version; {verb} takes "
                f"{policy_kinds_help(accepts)}"
            ) from None
    if found.kind not in accepts:
        raise InputError(
            f"{text} is {POLICY_KINDS[found.kind]}; {verb} takes {policy_kinds_help(accepts)}"
            f"{_instead(text, found.kind, accepts)}"
        )
    return found


def _instead(text: str, kind: PolicyKind, accepts: tuple[PolicyKind, ...]) -> str:
    """What to do with a policy of ``kind`` for a verb that takes only ``accepts``."""
    if kind == "checkpoint" and "export" in accepts:
        return f": export it first (robo-pipe export {text} --out DIR), then pass DIR"
    if accepts == ("registry",):
        return ": a pipeline run registers its export (robo-pipe run), then pass models:/NAME/N"
    if accepts == ("checkpoint",):
        return ": it is exported already (robo-pipe gate, evaluate and deploy take it as it is)"
    return ""
