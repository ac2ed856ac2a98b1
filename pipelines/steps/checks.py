"""Checks of a command's inputs, run before any work starts (a typo must not cost a pretraining
run). Each raises a :class:`~robo_pipe.errors.RoboPipeError` that names the input: the CLI
prints it and exits 2; the flow fails before its first stage.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.config import PipelineConfig
from pipelines.registry.exports import fetch_export
from pipelines.registry.versions import parse_model_uri
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


def resolve_policy(policy: str | Path) -> Path:
    """A path as given, or the downloaded bundle of a registry version (``models:/name@alias``
    or ``models:/name/3``)."""
    text = str(policy)
    if not text.startswith("models:"):
        return Path(policy)
    name, ref = parse_model_uri(text)
    return fetch_export(name, ref)[1]
