"""Tiny, random-weight models for tests: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from pipelines.config import load_config
from robots.spec import get_robot
from stages.policy.base import Normalizer
from stages.policy.checkpoint import CheckpointRef, new_policy, save_policy, untrained_normalizer
from tests.conftest import TINY_CONFIG

TINY_POLICY = load_config(TINY_CONFIG).policy
"""A default VLA small enough to train in seconds: the tiny profile's ``policy`` section."""


def rp5_normalizer() -> Normalizer:
    """A random tiny policy's normalizer for rp5 (:func:`untrained_normalizer`): its gripper
    openings inside the robot's limits, which every deploy boundary refuses otherwise."""
    return untrained_normalizer(get_robot("rp5"))


def tiny_base(folder: Path, image_size: int = 32, robot: str = "rp5") -> CheckpointRef:
    """A random-weight :data:`TINY_POLICY` base (a scene camera of ``image_size`` px, rp5's 6
    state and 6 action dimensions, made for ``robot``) saved in ``folder``, as pretraining
    would leave it."""
    policy, _ = new_policy(TINY_POLICY, ["scene"], image_size, robot, 6, 6)
    digest = save_policy(policy, folder, None)
    return CheckpointRef(str(folder), digest, "default", "all", 0, 1, 1)


TINY_VLM_POLICY = load_config(
    TINY_CONFIG, ["policy.type=hub-vlm", "policy.preset=tiny", "policy.weights=random"]
).policy
"""A hub-vlm policy on the ``tiny`` preset with random weights (no backbone): builds in
milliseconds, 72k parameters (:mod:`stages.policy.presets`)."""


def tiny_random_vlm(folder: Path, image_size: int = 32) -> CheckpointRef:
    """A :data:`TINY_VLM_POLICY` checkpoint (a scene camera of ``image_size`` px, rp5's 6 state
    and 6 action dimensions) saved in ``folder`` as LoRA fine-tuning would leave it: adapters
    and heads on the random-weight base."""
    policy, base = new_policy(TINY_VLM_POLICY, ["scene"], image_size, "rp5", 6, 6, rp5_normalizer())
    policy.add_lora(TINY_VLM_POLICY.lora)
    digest = save_policy(policy, folder, base)
    trainable, total = policy.parameter_counts()
    return CheckpointRef(str(folder), digest, "hub-vlm", "lora", 0, trainable, total, base)


def save_tiny_idefics3(directory: Path) -> Path:
    """The ``tiny`` preset (a random-weight Idefics3, SmolVLM's architecture) plus its word
    tokenizer, saved as a hub model directory would be; loaded through the same
    ``from_pretrained`` path as a real one."""
    from stages.policy.presets import get_preset, random_backbone, word_tokenizer

    tokenizer = word_tokenizer("touch")
    model, _ = random_backbone(get_preset("tiny"), len(tokenizer))
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory
