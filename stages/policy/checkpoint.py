"""Building policies, and saving/loading them as checkpoints (safetensors + JSON, no pickle).

A checkpoint is a directory::

    policy.json          format, policy type, architecture, normalisation stats, LoRA settings,
                         the frozen base it builds on (kind, path, hash), tensor names/shapes,
                         lineage (dataset hashes, config hash, code version, step, metrics)
    model.safetensors    only the tensors that train: everything for a pretrained base (or a
                         full fine-tune), LoRA adapters + heads for a LoRA fine-tune
    tokenizer/           the tokenizer files (shipped with the exported model too)

A LoRA checkpoint is meaningless without its base, so loading first loads the base -- a base
checkpoint (``kind: checkpoint``) or a pretrained backbone (``kind: hub``) -- and refuses it if
its hash differs from the one recorded. Loading then refuses missing, unexpected and mis-shaped
tensors, naming them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from robo_pipe.errors import RoboPipeError
from robo_pipe.records import Record
from stages.policy.base import Normalizer, VLAPolicy
from stages.policy.config import LoraSettings, PolicyConfig, VLAConfig
from stages.policy.hub_vla import (
    HubTokenizer,
    HubVLA,
    backbone_hash,
    load_backbone,
    resolve_backbone,
)
from stages.policy.tokenizer import InstructionTokenizer, task_family_corpus
from stages.policy.vla import DefaultVLA

FORMAT = "robo-pipe-policy/1"
POLICY_FILE = "policy.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"


class CheckpointError(RoboPipeError, ValueError):
    """A checkpoint is missing, corrupt, or does not match its model or base."""


@dataclass(frozen=True)
class BaseRef(Record):
    """The frozen model a checkpoint builds on."""

    kind: str
    """``checkpoint`` (a robo-pipe base checkpoint) or ``hub`` (a pretrained backbone)."""
    path: str
    hash: str
    """:func:`checkpoint_hash` of a base checkpoint; :func:`backbone_hash` of a backbone."""


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


# -- building ------------------------------------------------------------------------------------


def new_policy(
    policy: PolicyConfig,
    cameras: list[str] | tuple[str, ...],
    image_size: int,
    state_dim: int,
    action_dim: int,
    normalizer: Normalizer | None = None,
) -> tuple[VLAPolicy, BaseRef | None]:
    """A freshly initialised policy of ``policy.type`` (and the backbone it loaded, if any)."""
    if policy.type == "default":
        tokenizer = InstructionTokenizer.train(task_family_corpus(), policy.max_tokens)
        cfg = VLAConfig.from_pipeline(
            policy, cameras, image_size, state_dim, action_dim, tokenizer.vocab_size
        )
        return DefaultVLA(cfg, tokenizer, normalizer), None
    directory = resolve_backbone(str(policy.backbone))
    hub_tokenizer = HubTokenizer.load(directory, policy.max_tokens)
    cfg = VLAConfig.from_pipeline(
        policy, cameras, image_size, state_dim, action_dim, hub_tokenizer.vocab_size
    )
    base = BaseRef("hub", str(directory), backbone_hash(directory))
    return HubVLA(cfg, hub_tokenizer, normalizer, load_backbone(directory)), base


# -- saving --------------------------------------------------------------------------------------


def checkpoint_hash(directory: str | Path) -> str:
    """sha256 over policy.json, the weights and the tokenizer files (names and bytes)."""
    root = Path(directory)
    files = [root / POLICY_FILE, root / WEIGHTS_FILE, *sorted((root / TOKENIZER_DIR).glob("*"))]
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(root)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def save_new_policy(
    policy: PolicyConfig,
    cameras: list[str] | tuple[str, ...],
    image_size: int,
    out: Path,
    seed: int = 0,
) -> Path:
    """A freshly initialised policy (seeded; rp5's state and action sizes) saved as a checkpoint
    at ``out``: what benchmarks measure when they are given no trained one."""
    torch.manual_seed(seed)
    fresh, base = new_policy(policy, cameras, image_size, 6, 6)
    save_policy(fresh, out, base)
    return out


def save_policy(
    policy: VLAPolicy,
    directory: str | Path,
    base: BaseRef | None,
    lineage: dict[str, Any] | None = None,
) -> str:
    """Write ``policy`` as a checkpoint at ``directory`` (atomically: a crash leaves either the
    previous checkpoint or the new one, never half of one). Returns its :func:`checkpoint_hash`.
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
        "base": base.to_json() if base else None,
        "tensors": {n: list(t.shape) for n, t in tensors.items()},
        "lineage": lineage or {},
    }
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / WEIGHTS_FILE))
    policy.tokenizer.save(str(tmp / TOKENIZER_DIR))
    (tmp / POLICY_FILE).write_text(json.dumps(meta, indent=1))
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old)
    else:
        tmp.rename(directory)
    return checkpoint_hash(directory)


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
    return meta


def load_policy(directory: str | Path) -> VLAPolicy:
    """Load a checkpoint written by :func:`save_policy`, with its base. Raises
    :class:`CheckpointError` naming what is wrong (missing files, bad tensors, base hash)."""
    root = Path(directory)
    meta = read_policy_meta(root)
    try:
        cfg = VLAConfig.from_dict(meta["config"])
        norm = Normalizer(**meta["normalizer"])
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"{root / POLICY_FILE}: bad config or normalizer ({err})") from err
    base = BaseRef.from_json(meta["base"]) if meta.get("base") else None
    policy = _build_on_base(root, cfg, base)
    policy.set_normalizer(norm)
    if meta.get("lora"):
        policy.add_lora(LoraSettings(**meta["lora"]))
    elif meta.get("trainable") == "all":
        policy.requires_grad_(True)
    load_trainable(policy, root / WEIGHTS_FILE)
    return policy


def _build_on_base(root: Path, cfg: VLAConfig, base: BaseRef | None) -> VLAPolicy:
    if base is None:
        if cfg.type != "default":
            raise CheckpointError(f"{root}: a {cfg.type!r} checkpoint needs a base backbone")
        tokenizer = InstructionTokenizer.load(root / TOKENIZER_DIR, cfg.max_tokens)
        return DefaultVLA(cfg, tokenizer)
    if not Path(base.path).exists():
        raise CheckpointError(f"{root}: its base {base.kind} {base.path} does not exist")
    if base.kind == "checkpoint":
        actual = checkpoint_hash(base.path)
        if actual != base.hash:
            raise CheckpointError(
                f"{root}: base checkpoint {base.path} has hash {actual[:12]}, but this "
                f"checkpoint was trained on {base.hash[:12]}; refusing a different base"
            )
        policy = load_policy(base.path)
        if policy.cfg != cfg:
            raise CheckpointError(f"{root}: architecture differs from its base {base.path}")
        return policy
    if base.kind == "hub":
        directory = Path(base.path)
        actual = backbone_hash(directory)
        if actual != base.hash:
            raise CheckpointError(
                f"{root}: backbone {directory} has hash {actual[:12]}, but this checkpoint "
                f"was trained on {base.hash[:12]}; refusing a different base"
            )
        hub_tokenizer = HubTokenizer.load(root / TOKENIZER_DIR, cfg.max_tokens)
        return HubVLA(cfg, hub_tokenizer, None, load_backbone(directory))
    raise CheckpointError(f"{root}: unknown base kind {base.kind!r}")


def load_trainable(policy: VLAPolicy, weights: Path) -> None:
    """Load ``weights`` into the parameters of ``policy`` that train, strictly."""
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights}: unreadable safetensors file ({err})") from err
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
