"""``policy.type: default``: the small VLA of :mod:`stages.policy.vla`, built from the config with
random weights, pretrained by robo-pipe on the task family (its base, a checkpoint that stands
alone) and fine-tuned on that base (base kind ``checkpoint``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from stages.policy.config import PolicyConfig, VLAConfig
from stages.policy.types import CHECKPOINT_BASE, BaseRef, PolicyType

if TYPE_CHECKING:
    from robo_pipe.integrity import FileSum
    from stages.policy.base import Normalizer, VLAPolicy


class DefaultType(PolicyType):
    """The default VLA: no pretrained weights; ``robo-pipe pretrain`` makes its base."""

    base_kinds: ClassVar[tuple[str, ...]] = (CHECKPOINT_BASE,)
    needs_pretraining: ClassVar[bool] = True

    @classmethod
    def build(
        cls, policy: PolicyConfig, cfg: VLAConfig, normalizer: Normalizer | None
    ) -> tuple[VLAPolicy, BaseRef | None]:
        """A DefaultVLA with random weights and a tokenizer trained on the instructions of its
        task family (``cfg.task``)."""
        from sim_scenes.tasks import task_family
        from stages.policy.tokenizer import InstructionTokenizer
        from stages.policy.vla import DefaultVLA

        corpus = task_family(cfg.task).instructions()
        tokenizer = InstructionTokenizer.train(corpus, policy.max_tokens)
        cfg = replace(cfg, vocab_size=tokenizer.vocab_size)
        return DefaultVLA(cfg, tokenizer, normalizer), None

    @classmethod
    def load_alone(cls, root: Path, cfg: VLAConfig) -> VLAPolicy:
        """A pretrained base (or any checkpoint holding every parameter) with its tokenizer."""
        from stages.policy.checkpoint import TOKENIZER_DIR
        from stages.policy.tokenizer import InstructionTokenizer
        from stages.policy.vla import DefaultVLA

        tokenizer = InstructionTokenizer.load(root / TOKENIZER_DIR, cfg.max_tokens)
        return DefaultVLA(cfg, tokenizer)

    @classmethod
    def load_on_base(cls, root: Path, cfg: VLAConfig, base: BaseRef) -> VLAPolicy:
        """The base checkpoint, verified, hash compared and loaded; it must have ``cfg``'s
        architecture."""
        from stages.policy.checkpoint import CheckpointError, load_policy

        sums = cls.check_base(root, base)
        policy = load_policy(base.path, verified=sums)
        # A delay-conditioned fine-tune adds its prefix encoder to a base that has none.
        if replace(policy.cfg, prefix_ticks=cfg.prefix_ticks) != cfg:
            raise CheckpointError(f"{root}: architecture differs from its base {base.path}")
        return policy

    @classmethod
    def check_base(cls, root: Path, base: BaseRef) -> dict[str, FileSum]:
        """The base checkpoint verified against its checksums and its hash compared (each file
        read once); returns its verified entries."""
        from stages.policy.checkpoint import (
            checkpoint_hash,
            compare_base,
            require_base_path,
            verify_checkpoint,
        )

        require_base_path(root, base)
        sums = verify_checkpoint(base.path)
        compare_base(root, base, checkpoint_hash(base.path, sums), f"base checkpoint {base.path}")
        return sums
