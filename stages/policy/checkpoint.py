"""Building policies, and saving/loading them as checkpoints (safetensors + JSON, no pickle).

A checkpoint is a directory::

    policy.json          format, policy type, architecture, normalisation stats, LoRA settings,
                         the frozen base it builds on (kind, path, hash), tensor names/shapes,
                         lineage (dataset hashes, config hash, code version, step, metrics)
    model.safetensors    only the tensors that train: everything for a pretrained base (or a
                         full fine-tune), LoRA adapters + heads for a LoRA fine-tune
    tokenizer/           the tokenizer files (shipped with the exported model too)
    checksums.json       size and sha256 of each file above (:mod:`robo_pipe.integrity`)

Loading verifies every file against ``checksums.json`` before building anything (a flipped
byte in the weights is refused, naming the file and the check). A LoRA checkpoint is
meaningless without its base, so loading then loads the base -- a base checkpoint (``kind:
checkpoint``, verified the same way, once), a pretrained backbone (``kind: hub``) or a preset
built with random weights (``kind: random``, built again: :mod:`stages.policy.presets`) -- and
refuses it if its hash differs from the one recorded. A base checkpoint beside this one (under
the same grandparent folder, as in the home's ``checkpoints/``) is named by a path relative to
the checkpoint, so a folder of checkpoints (a robo-pipe home) can be moved or copied whole; any
other base by its absolute path. The policy type that the base's kind
names (:func:`~stages.policy.types.base_type`) loads and checks it; a fresh policy is built by
its type (:func:`~stages.policy.types.policy_type`). Loading then refuses missing, unexpected
and mis-shaped tensors, naming them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from robo_pipe.atomic import discard_dead_temporaries, replace_dir, temporary_path
from robo_pipe.errors import RoboPipeError
from robo_pipe.integrity import (
    CHECKSUMS_FILE,
    FileSum,
    file_sha256,
    file_sums,
    tree_sha256,
    verify_checksums,
    write_checksums,
    writing,
)
from robo_pipe.records import Record
from robots.spec import RobotSpec, get_robot
from sim_scenes.tasks import DEFAULT_FAMILY
from stages.policy.base import Normalizer, VLAPolicy
from stages.policy.config import POLICY_TYPES, LoraSettings, PolicyConfig, VLAConfig
from stages.policy.types import BaseRef, PolicyType, base_type, policy_type

FORMAT = "robo-pipe-policy/1"
POLICY_FILE = "policy.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
VERIFY_FIX = (
    "the checkpoint is corrupt, was changed after it was saved, or predates checksums: delete "
    "it and re-create it (re-run the command that wrote it)"
)
"""What to do about a checkpoint that fails verification."""


class CheckpointError(RoboPipeError, ValueError):
    """A checkpoint is missing, corrupt, or does not match its model or base."""


@dataclass(frozen=True)
class CheckpointRef(Record):
    """What pretrain and finetune hand on (JSON-serialisable)."""

    path: str
    content_hash: str
    """:func:`checkpoint_hash` of the directory."""
    policy_type: str
    trainable: str
    """``all`` or ``lora`` (adapters + heads)."""
    step: int
    trainable_params: int
    total_params: int
    base: BaseRef | None = None
    """The frozen model it builds on (None: it holds every parameter)."""
    dataset_hashes: list[str] = field(default_factory=list)
    config_hash: str = ""
    code_version: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    start_checkpoint: str = ""
    """RL fine-tuning only: the checkpoint RL started from (its BC warm start, or the base with
    fresh adapters); empty for behaviour cloning."""
    worker_nodes: list[str] = field(default_factory=list)
    """Behaviour cloning on Ray Train: the Ray node of each training worker, by rank (the
    latest attempt's); empty when it trained in one process."""


# -- building ------------------------------------------------------------------------------------


def new_policy(
    policy: PolicyConfig,
    cameras: list[str] | tuple[str, ...],
    image_size: int,
    robot: str,
    state_dim: int,
    action_dim: int,
    normalizer: Normalizer | None = None,
    task: str = DEFAULT_FAMILY,
) -> tuple[VLAPolicy, BaseRef | None]:
    """A freshly initialised policy of ``policy.type`` for ``robot`` (its registry name; the
    state and action sizes are its) and the task family ``task`` (whose instructions its own
    tokenizer learns), and the backbone it stands on, if any: loaded from ``policy.backbone``,
    or ``policy.preset`` built with random weights."""
    sizes = (state_dim, action_dim, 0)
    cfg = VLAConfig.from_pipeline(policy, cameras, image_size, *sizes, robot, task)
    return policy_type(policy.type).build(policy, cfg, normalizer)


# -- saving --------------------------------------------------------------------------------------


def policy_files(directory: str | Path) -> list[Path]:
    """The files that make up the policy, those present: policy.json, the weights, the
    tokenizer files (not the checksums, nor a step checkpoint's training state)."""
    root = Path(directory)
    tokenizer = sorted(p for p in (root / TOKENIZER_DIR).rglob("*") if p.is_file())
    return [p for p in (root / POLICY_FILE, root / WEIGHTS_FILE) if p.is_file()] + tokenizer


def checkpoint_hash(directory: str | Path, sums: Mapping[str, FileSum] | None = None) -> str:
    """sha256 over policy.json, the weights and the tokenizer files (names and sha256s); from
    ``sums`` (verified entries, see :func:`verify_checkpoint`) when given, instead of reading
    the files again."""
    root = Path(directory)
    pairs = []
    for file in policy_files(root):
        rel = file.relative_to(root).as_posix()
        pairs.append((rel, sums[rel].sha256 if sums is not None else file_sha256(file)))
    return tree_sha256(pairs)


def verify_checkpoint(directory: str | Path) -> dict[str, FileSum]:
    """Check the checkpoint's files against its ``checksums.json`` (none missing or added, then
    sizes, then sha256, each read once); return the verified entries. Raises
    :class:`~robo_pipe.integrity.IntegrityError` naming the file and the check, or
    :class:`CheckpointError` when ``directory`` is no checkpoint at all."""
    root = Path(directory)
    if not (root / POLICY_FILE).is_file():
        raise CheckpointError(f"{root}: not a checkpoint (no {POLICY_FILE})")
    return verify_checksums(root, policy_files(root), CHECKSUMS_FILE, VERIFY_FIX)


def save_new_policy(
    policy: PolicyConfig,
    cameras: list[str] | tuple[str, ...],
    image_size: int,
    out: Path,
    seed: int = 0,
) -> Path:
    """A freshly initialised policy (seeded; rp5's state and action sizes and
    :func:`untrained_normalizer`) saved as a checkpoint at ``out``: what benchmarks measure when
    they are given no trained one."""
    torch.manual_seed(seed)
    rp5 = get_robot("rp5")
    fresh, base = new_policy(
        policy,
        cameras,
        image_size,
        rp5.name,
        rp5.state_dim,
        rp5.action.dim,
        untrained_normalizer(rp5),
    )
    save_policy(fresh, out, base)
    return out


def untrained_normalizer(spec: RobotSpec) -> Normalizer:
    """The normalizer of a policy for ``spec``'s robot that has seen no data: the identity,
    except each ``absolute`` or ``effort`` action, centred in its range with a sixth of it as
    its std (rp5's gripper opening: 0.03 +- 0.01 m), where a trained policy's normalizer (its
    demonstrations') puts it.

    Why: under the identity a random policy emits openings of about -0.12..0.90 m, which every
    boundary between a policy and a robot refuses as outside the robot's limits
    (:func:`robots.limits.action_fault`), so nothing untrained could be gated or run. Its arm
    deltas (up to 1.24 rad measured) stay inside every joint's travel and are clipped to the
    rate bound as before."""
    norm = Normalizer.identity(spec.state_dim, spec.action.dim)
    for k in spec.action.of_kind("absolute", "effort"):
        low, high = spec.action.low[k], spec.action.high[k]
        norm.action_mean[k], norm.action_std[k] = (low + high) / 2, (high - low) / 6
    return norm


def save_policy(
    policy: VLAPolicy,
    directory: str | Path,
    base: BaseRef | None,
    lineage: dict[str, Any] | None = None,
) -> str:
    """Write ``policy`` as a checkpoint at ``directory`` (atomically: a kill or a power cut at
    any moment leaves either the previous checkpoint or the new one there, never half of one,
    nor none: :func:`~robo_pipe.atomic.replace_dir`), with its ``checksums.json``.
    Returns its :func:`checkpoint_hash`. A full disk raises
    :class:`~robo_pipe.errors.OutOfSpaceError`; the previous checkpoint stays as it was.
    """
    directory = Path(directory)
    tensors = {n: t.contiguous() for n, t in policy.trainable_state().items()}
    everything = len(tensors) == sum(1 for _ in policy.parameters())
    if base is None and not everything:
        raise CheckpointError("a checkpoint without a base must hold every parameter")
    meta = {
        "format": FORMAT,
        "type": policy.cfg.type,
        "config": policy.cfg.to_dict(),
        "normalizer": policy.normalizer.to_dict(),
        "lora": policy.lora.model_dump() if policy.lora else None,
        "trainable": "all" if everything else "lora",
        "base": _base_as_stored(base, directory) if base else None,
        "tensors": {n: list(t.shape) for n, t in tensors.items()},
        "lineage": lineage or {},
    }
    # Written complete beside the old checkpoint, synced, then swapped in: at every moment the
    # path holds a whole checkpoint. Leftovers of killed saves go first (never a live one's).
    discard_dead_temporaries(directory.parent, of=directory.name)
    tmp = temporary_path(directory)
    with writing(directory, tmp):
        tmp.mkdir(parents=True)
        save_file(tensors, str(tmp / WEIGHTS_FILE))
        policy.tokenizer.save(str(tmp / TOKENIZER_DIR))
        (tmp / POLICY_FILE).write_text(json.dumps(meta, indent=1))
        sums = file_sums(tmp, policy_files(tmp))
        write_checksums(tmp, sums)
        replace_dir(tmp, directory)
    return checkpoint_hash(directory, sums)


# -- loading -------------------------------------------------------------------------------------


def read_policy_meta(directory: str | Path) -> dict[str, Any]:
    """``policy.json`` of a checkpoint, validated for format."""
    root = Path(directory)
    path = root / POLICY_FILE
    if not path.is_file():
        raise CheckpointError(f"{root}: not a checkpoint (no {POLICY_FILE})")
    try:
        meta: dict[str, Any] = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from err
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: format {meta.get('format')!r} is not {FORMAT!r} (not a robo-pipe policy)"
        )
    if meta.get("base") and meta["base"].get("kind") == "checkpoint":
        # A relative base path is relative to this checkpoint; an absolute one stays as it is.
        meta["base"]["path"] = os.path.normpath(root.absolute() / meta["base"]["path"])
    return meta


def _base_as_stored(base: BaseRef, directory: Path) -> dict[str, Any]:
    """``base`` as ``policy.json`` keeps it: a base checkpoint under ``directory``'s grandparent
    (``checkpoints/base-*/step-*`` beside ``checkpoints/<run>/step-*``) by a relative path."""
    stored = base.to_json()
    beside = directory.absolute().parent.parent
    if base.kind == "checkpoint" and Path(base.path).absolute().is_relative_to(beside):
        stored["path"] = os.path.relpath(Path(base.path).absolute(), directory.absolute())
    return stored


def load_policy(directory: str | Path, verified: Mapping[str, FileSum] | None = None) -> VLAPolicy:
    """Load a checkpoint written by :func:`save_policy`, with its base.

    Every file is first verified against ``checksums.json`` (:func:`verify_checkpoint`), unless
    ``verified`` holds what that returned for this very directory (so a caller that needed the
    hash first reads each file once). Raises :class:`~robo_pipe.integrity.IntegrityError` naming
    a file that fails (and the check), and :class:`CheckpointError` naming what else is wrong
    (missing files, bad tensors, base hash)."""
    root = Path(directory)
    if verified is None:
        verify_checkpoint(root)
    return _load_verified(root)


def _load_verified(root: Path) -> VLAPolicy:
    """The checkpoint at ``root``, whose files were verified, on its base."""
    meta = read_policy_meta(root)
    try:
        cfg = VLAConfig.from_dict(meta["config"])
        norm = Normalizer(**meta["normalizer"])
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"{root / POLICY_FILE}: bad config or normalizer ({err})") from err
    base = BaseRef.from_json(meta["base"]) if meta.get("base") else None
    policy = _build_on_base(root, cfg, base)
    policy.set_normalizer(norm)
    if cfg.prefix_ticks:  # a delay-conditioned fine-tune of a base that was not
        policy.condition_on_prefix(cfg.prefix_ticks)
    if meta.get("lora"):
        policy.add_lora(LoraSettings(**meta["lora"]))
    elif meta.get("trainable") == "all":
        policy.requires_grad_(True)
    load_trainable(policy, root / WEIGHTS_FILE)
    return policy


def _build_on_base(root: Path, cfg: VLAConfig, base: BaseRef | None) -> VLAPolicy:
    if base is None:  # only a type robo-pipe pretrains has checkpoints that stand alone
        if cfg.type not in POLICY_TYPES or not policy_type(cfg.type).needs_pretraining:
            raise CheckpointError(f"{root}: a {cfg.type!r} checkpoint needs a base backbone")
        return policy_type(cfg.type).load_alone(root, cfg)
    return _base_type(root, base).load_on_base(root, cfg, base)


def check_base(root: Path, base: BaseRef) -> dict[str, FileSum]:
    """Check that ``base``, the base of the checkpoint at ``root``, is the one it was trained
    on: a base checkpoint is verified against its checksums and its hash compared with the one
    recorded (each file read once; returns its verified entries), a backbone's hash compared
    (returns no entries), a random-weight backbone built again and its hash compared (returns
    no entries). Raises :class:`CheckpointError` for a base that is missing or different,
    :class:`~robo_pipe.integrity.IntegrityError` for one that fails verification."""
    return _base_type(root, base).check_base(root, base)


def _base_type(root: Path, base: BaseRef) -> type[PolicyType]:
    """The policy type that loads a base of this kind (a checkpoint error if none does)."""
    kind = base_type(base.kind)
    if kind is None:
        raise CheckpointError(f"{root}: unknown base kind {base.kind!r}")
    return kind


def require_base_path(root: Path, base: BaseRef) -> None:
    """A base that is a directory (a base checkpoint, a backbone) is there."""
    if not Path(base.path).exists():
        raise CheckpointError(f"{root}: its base {base.kind} {base.path} does not exist")


def compare_base(root: Path, base: BaseRef, actual: str, what: str) -> None:
    """Refuse ``base`` (``what``, e.g. ``backbone DIR``) if ``actual``, its hash now, differs
    from the one the checkpoint at ``root`` recorded."""
    if actual != base.hash:
        raise CheckpointError(
            f"{root}: {what} has hash {actual[:12]}, but this checkpoint was trained on "
            f"{base.hash[:12]}; refusing a different base"
        )


LEGACY_UNUSED_TENSORS = ("transformer.embeddings.word_embeddings.weight",)
"""Parameters that the default VLA no longer has because they never trained (see
:class:`~stages.policy.vla.DefaultVLA`): checkpoints written before hold them; loading drops
exactly these, and is strict about everything else."""


def load_trainable(policy: VLAPolicy, weights: Path) -> None:
    """Load ``weights`` into the parameters of ``policy`` that train, strictly (apart from the
    :data:`LEGACY_UNUSED_TENSORS` of older checkpoints)."""
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights}: unreadable safetensors file ({err})") from err
    for name in LEGACY_UNUSED_TENSORS:
        tensors.pop(name, None)
    expected = dict(policy.trainable_state())
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    misshaped = [
        f"{n} {list(tensors[n].shape)} (model {list(expected[n].shape)})"
        for n in sorted(set(expected) & set(tensors))
        if tensors[n].shape != expected[n].shape
    ]
    problems = []
    for label, names in (
        ("missing tensors", missing),
        ("unexpected tensors", unexpected),
        ("mis-shaped tensors", misshaped),
    ):
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise CheckpointError(f"{weights}: does not match the model: {'; '.join(problems)}")
    params = dict(policy.named_parameters())
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
