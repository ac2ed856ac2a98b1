"""Seed streams: every episode's seed derived from the run's root seed.

A seed is a complete description of an episode's scene (:func:`sim_scenes.touch.sample_layout`
draws everything random from it), so these streams decide which episodes a run plays: the
demonstrations collected, the evaluation suite, the demo's episodes, and the episodes an
environment plays after each autoreset. Every backend draws from them, the same way.
"""

from __future__ import annotations

import numpy as np

from sim_scenes.errors import SceneError

SEED_PURPOSES = ("collect", "eval", "demo", "benchmark")
"""Independent seed streams: episodes for training data never reuse evaluation seeds."""


def episode_seeds(root_seed: int, count: int, purpose: str) -> list[int]:
    """``count`` episode seeds for ``purpose``, derived from the run's root seed.

    Streams of different purposes are independent 64-bit hashes, so collection and evaluation
    seeds do not collide (probability ~count^2 / 2^64), and a longer list extends a shorter one.
    """
    if purpose not in SEED_PURPOSES:
        raise SceneError(
            f"unknown seed purpose {purpose!r}; valid choices: {', '.join(SEED_PURPOSES)}"
        )
    key = SEED_PURPOSES.index(purpose)
    seeds = []
    for i in range(count):
        words = np.random.SeedSequence(root_seed, spawn_key=(key, i)).generate_state(2)
        seeds.append(int(words[0]) << 31 | int(words[1]) >> 1)  # 62-bit, fits int64
    return seeds


def next_episode_seed(seed: int, episode: int) -> int:
    """Seed of an environment's ``episode``-th autoreset after it was reset with ``seed``."""
    ss = np.random.SeedSequence(entropy=seed, spawn_key=(episode,))
    return int(ss.generate_state(1, dtype=np.uint32)[0])
