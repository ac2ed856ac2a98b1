"""A training run's directory: step checkpoints committed atomically, and the metrics log.

    <out>/step-XXXXXXX/           a policy checkpoint (policy.json, model.safetensors, tokenizer/,
                                  checksums.json)
          training/<file>.safetensors   what resuming needs: optimizer moments, torch RNG, heads
          training/state.json           the step and whatever else the trainer keeps as JSON
          training/checksums.json       size and sha256 of the two files above
    <out>/metrics.jsonl           one JSON record per logged step

BC (:mod:`stages.finetune.bc`) and the RL learner (:mod:`stages.finetune.learner`) both write
here. A checkpoint is written into a staging directory (a temporary naming its writer's pid),
synced and renamed into place (:func:`~robo_pipe.atomic.replace_dir`), so
:func:`latest_checkpoint` only ever sees complete ones, even after a power cut; the newest
``KEEP_CHECKPOINTS`` stay.
A full disk while writing one raises :class:`~robo_pipe.errors.OutOfSpaceError` and leaves the
earlier ones as they were, so a re-run resumes from the latest. Both the policy and the training
state are verified against their checksums when read. torch loads only when a checkpoint is
written or read: reading metrics stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from robo_pipe.atomic import (
    discard_dead_temporaries,
    remove_dir,
    replace_dir,
    temporary_path,
)
from robo_pipe.integrity import (
    CHECKSUMS_FILE,
    file_sums,
    verify_checksums,
    write_checksums,
    writing,
)

if TYPE_CHECKING:
    import torch

    from stages.policy.base import VLAPolicy
    from stages.policy.types import BaseRef

TRAINING_DIR = "training"
"""Inside a step checkpoint: optimizer and RNG state for resuming (not part of the policy)."""
STATE_FILE = "state.json"
METRICS_FILE = "metrics.jsonl"
KEEP_CHECKPOINTS = 2


def step_dir(out: Path, step: int) -> Path:
    """Checkpoint directory of ``step``."""
    return out / f"step-{step:07d}"


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete step checkpoint under ``out`` (half-written ones never qualify:
    :func:`commit_checkpoint` renames a finished directory into place). One without checksums
    was written by a robo-pipe before they existed and cannot be verified: training starts
    again rather than resume from it (or fail on it)."""
    steps = sorted(
        p
        for p in out.glob("step-*")
        if (p / TRAINING_DIR / STATE_FILE).is_file() and (p / CHECKSUMS_FILE).is_file()
    )
    return steps[-1] if steps else None


def commit_checkpoint(
    out: Path,
    step: int,
    policy: VLAPolicy,
    base: BaseRef | None,
    lineage: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    tensors_file: str,
    state: dict[str, Any],
) -> Path:
    """Write ``step-<step>`` atomically: the policy checkpoint, ``tensors`` (plus the torch RNG)
    as ``training/<tensors_file>`` and ``{"step": step, **state}`` as ``training/state.json``;
    then delete all but the newest ``KEEP_CHECKPOINTS``. Returns the checkpoint directory."""
    import torch
    from safetensors.torch import save_file

    from stages.policy.checkpoint import save_policy

    final = step_dir(out, step)
    discard_dead_temporaries(out)  # killed commits' staging directories (never a live one's)
    staging = temporary_path(final)
    with writing(final, staging, kept="the earlier step checkpoints are kept"):
        save_policy(policy, staging, base, lineage)
        training = staging / TRAINING_DIR
        training.mkdir()
        save_file({"rng/torch": torch.get_rng_state(), **tensors}, str(training / tensors_file))
        (training / STATE_FILE).write_text(json.dumps({"step": step, **state}))
        write_checksums(training, file_sums(training, sorted(training.iterdir())))
        replace_dir(staging, final)
    for old in sorted(out.glob("step-*"))[:-KEEP_CHECKPOINTS]:
        remove_dir(old)  # renamed away first: never half a step checkpoint under its name
    return final


def restore_training_state(
    directory: Path, tensors_file: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What :func:`commit_checkpoint` wrote besides the policy: restores the torch RNG and
    returns the other tensors and the state, once verified against ``training/checksums.json``.
    Raises :class:`~robo_pipe.integrity.IntegrityError` if they differ from it and
    :class:`CheckpointError` if unreadable."""
    import torch
    from safetensors.torch import load_file

    from stages.policy.checkpoint import VERIFY_FIX, CheckpointError

    training = directory / TRAINING_DIR
    verify_checksums(training, [p for p in training.glob("*") if p.is_file()], fix=VERIFY_FIX)
    try:
        tensors = load_file(str(directory / TRAINING_DIR / tensors_file))
        state: dict[str, Any] = json.loads((directory / TRAINING_DIR / STATE_FILE).read_text())
        rng = tensors.pop("rng/torch")
    except Exception as err:  # any unreadable state is the same failure: say which and why
        raise CheckpointError(
            f"{directory / TRAINING_DIR}: unreadable training state ({err})"
        ) from err
    torch.set_rng_state(rng)
    return tensors, state


def log_metrics(out: Path, record: dict[str, Any]) -> None:
    """Append one record to ``metrics.jsonl``."""
    with (out / METRICS_FILE).open("a") as f:
        f.write(json.dumps(record) + "\n")


def read_metrics(out: Path) -> list[dict[str, float]]:
    """Logged metrics, one record per logged step (the latest record wins after a resume)."""
    path = out / METRICS_FILE
    if not path.is_file():
        return []
    by_step: dict[float, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]
