"""``policy.type: hub-vlm``: a pretrained vision-language backbone with LoRA and our action head
(:mod:`stages.policy.hub_vla`), loaded from ``policy.backbone`` (base kind ``hub``) or, as a
systems test, ``policy.preset``'s architecture built with random weights (base kind
``random``, built again on every load: :mod:`stages.policy.presets`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from stages.policy.config import PRESET_NAMES, PolicyConfig, VLAConfig
from stages.policy.types import BaseRef, PolicyType

if TYPE_CHECKING:
    from robo_pipe.integrity import FileSum
    from stages.policy.base import Normalizer, VLAPolicy
    from stages.policy.presets import Preset

HUB = "hub"
"""Base kind of a pretrained backbone: its directory, hashed."""
RANDOM = "random"
"""Base kind of a preset built with random weights: the preset's name, the weights' hash."""


class HubVLMType(PolicyType):
    """A pretrained VLM backbone (or a preset with random weights) with LoRA."""

    base_kinds: ClassVar[tuple[str, ...]] = (HUB, RANDOM)
    owned_fields: ClassVar[dict[str, object]] = {"preset": None, "weights": "pretrained"}

    @classmethod
    def check_config(cls, policy: PolicyConfig) -> None:
        """Weights from ``backbone``, or random weights of ``preset``'s architecture: one of
        the two, never both."""
        if policy.weights == "random":
            if policy.backbone:
                raise ValueError(
                    f"policy.weights 'random' and policy.backbone {policy.backbone!r} contradict "
                    "each other: random weights are for systems tests without a backbone; "
                    "drop one"
                )
            if policy.preset is None:
                raise ValueError(
                    "policy.weights 'random' needs policy.preset (the architecture to build: "
                    f"{', '.join(PRESET_NAMES)})"
                )
        elif not policy.backbone:
            raise ValueError(
                "policy.type 'hub-vlm' needs policy.backbone (a local directory or hub id of "
                "pretrained weights), or policy.weights: random with a policy.preset (random "
                "weights: systems test only, never champion)"
            )

    @classmethod
    def check_inputs(cls, policy: PolicyConfig) -> None:
        """The backbone directory (or hub id) resolves."""
        if policy.backbone:
            from stages.policy.hub_vla import resolve_backbone

            resolve_backbone(policy.backbone)

    @classmethod
    def build(
        cls, policy: PolicyConfig, cfg: VLAConfig, normalizer: Normalizer | None
    ) -> tuple[VLAPolicy, BaseRef | None]:
        """A HubVLA on the loaded backbone (checked against ``preset`` if given), or on the
        preset built with random weights."""
        from stages.policy.hub_vla import (
            HubTokenizer,
            HubVLA,
            backbone_hash,
            load_backbone,
            resolve_backbone,
        )
        from stages.policy.presets import (
            check_backbone,
            get_preset,
            random_backbone,
            word_tokenizer,
        )

        if policy.random_weights:
            preset = get_preset(str(policy.preset))
            hub_tokenizer = HubTokenizer(word_tokenizer(cfg.task), policy.max_tokens)
            backbone, digest = random_backbone(preset, hub_tokenizer.vocab_size)
            base = BaseRef(RANDOM, preset.name, digest)
        else:
            directory = resolve_backbone(str(policy.backbone))
            hub_tokenizer = HubTokenizer.load(directory, policy.max_tokens)
            backbone = load_backbone(directory)
            if policy.preset:  # with weights, the preset only checks (and labels) the architecture
                check_backbone(get_preset(policy.preset), backbone.config, str(directory))
            base = BaseRef(HUB, str(directory), backbone_hash(directory))
        cfg = replace(cfg, vocab_size=hub_tokenizer.vocab_size)
        return HubVLA(cfg, hub_tokenizer, normalizer, backbone), base

    @classmethod
    def frozen_base(cls, policy: PolicyConfig, task: str) -> BaseRef:
        """The backbone at ``policy.backbone``, or ``policy.preset`` with random weights and a
        word tokenizer of ``task``'s instructions (built once per process to hash it)."""
        from stages.policy.hub_vla import HubTokenizer, backbone_hash, resolve_backbone
        from stages.policy.presets import get_preset, random_backbone_hash, word_tokenizer

        if policy.random_weights:
            preset = get_preset(str(policy.preset))
            tokens = HubTokenizer(word_tokenizer(task), policy.max_tokens).vocab_size
            return BaseRef(RANDOM, preset.name, random_backbone_hash(preset, tokens))
        directory = resolve_backbone(str(policy.backbone))
        return BaseRef(HUB, str(directory), backbone_hash(directory))

    @classmethod
    def load_on_base(cls, root: Path, cfg: VLAConfig, base: BaseRef) -> VLAPolicy:
        """The backbone loaded (its hash compared first), or the preset built again once and
        its hash compared."""
        from stages.policy.checkpoint import TOKENIZER_DIR, compare_base
        from stages.policy.hub_vla import HubTokenizer, HubVLA, load_backbone
        from stages.policy.presets import random_backbone

        if base.kind == RANDOM:  # built once here, and its hash compared
            hub_tokenizer = HubTokenizer.load(root / TOKENIZER_DIR, cfg.max_tokens)
            backbone, actual = random_backbone(_preset(root, base), hub_tokenizer.vocab_size)
            compare_base(root, base, actual, f"random-weight preset {base.path}")
            return HubVLA(cfg, hub_tokenizer, None, backbone)
        cls.check_base(root, base)
        hub_tokenizer = HubTokenizer.load(root / TOKENIZER_DIR, cfg.max_tokens)
        return HubVLA(cfg, hub_tokenizer, None, load_backbone(Path(base.path)))

    @classmethod
    def check_base(cls, root: Path, base: BaseRef) -> dict[str, FileSum]:
        """The backbone's hash, or the random-weight preset built again and its hash, compared
        with the one recorded; returns no entries."""
        from stages.policy.checkpoint import TOKENIZER_DIR, compare_base, require_base_path
        from stages.policy.hub_vla import HubTokenizer, backbone_hash
        from stages.policy.presets import random_backbone_hash

        if base.kind == RANDOM:
            tokens = HubTokenizer.load(root / TOKENIZER_DIR, 1).vocab_size  # its size only
            actual = random_backbone_hash(_preset(root, base), tokens)
            compare_base(root, base, actual, f"random-weight preset {base.path}")
            return {}
        require_base_path(root, base)
        compare_base(root, base, backbone_hash(Path(base.path)), f"backbone {base.path}")
        return {}


def _preset(root: Path, base: BaseRef) -> Preset:
    """The preset a random-weight base names (a checkpoint error if this robo-pipe has none)."""
    from stages.policy.checkpoint import CheckpointError
    from stages.policy.presets import PresetError, get_preset

    try:
        return get_preset(base.path)
    except PresetError as err:
        raise CheckpointError(f"{root}: random-weight base: {err}") from err
