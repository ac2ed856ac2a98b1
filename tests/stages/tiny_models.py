"""Tiny, random-weight models for tests: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from pipelines.config import load_config
from stages.policy.checkpoint import CheckpointRef, new_policy, save_policy
from stages.policy.tokenizer import InstructionTokenizer, task_family_corpus
from tests.conftest import TINY_CONFIG

TINY_POLICY = load_config(TINY_CONFIG).policy
"""A default VLA small enough to train in seconds: the tiny profile's ``policy`` section."""


def tiny_base(folder: Path, image_size: int = 32) -> CheckpointRef:
    """A random-weight :data:`TINY_POLICY` base (a scene camera of ``image_size`` px, rp5's 6
    state and 6 action dimensions) saved in ``folder``, as pretraining would leave it."""
    policy, _ = new_policy(TINY_POLICY, ["scene"], image_size, 6, 6)
    digest = save_policy(policy, folder, None)
    return CheckpointRef(str(folder), digest, "default", "all", 0, 1, 1)


def save_tiny_idefics3(directory: Path) -> Path:
    """A random-weight Idefics3 (SmolVLM architecture) plus a tokenizer, saved as a hub model
    directory would be; loaded through the same ``from_pretrained`` path as a real one."""
    from transformers import Idefics3Config, Idefics3Model, PreTrainedTokenizerFast

    words = InstructionTokenizer.train(task_family_corpus()).tokenizer
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]"
    )
    config = Idefics3Config(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        text_config={
            "model_type": "llama",
            "hidden_size": 48,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 128,
        },
        scale_factor=2,
    )
    Idefics3Model(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory
