"""The touch task's corrupted-instruction controls: instructions a policy that reads cannot use.

Evaluation plays them on the same scenes and targets as the trained phrasings, and success
still means touching the drawn target, so they separate a policy that reads its instruction
from one that succeeds without it (LIBERO-PRO's corrupted instructions):

- ``nonce``: a trained template whose colour and shape are pseudowords of child-language
  studies ("touch the dax blicket"): the instruction names nothing, and a policy that reads it
  falls to chance (1 in the objects on the table);
- ``absent``: a trained template naming a colour and shape that no object has ("touch the
  green ball" where there is none): a policy led by the words goes to what shares them, which
  in touch-mixed is never the target's colour, so it falls *below* chance;
- ``shuffled``: the trained words in another order: only a policy that needs the word order
  loses the target (one that reads words as a bag keeps it).

Each draws from its own stream of the episode's seed, so the scene is the one the trained
phrasing plays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CONTROL_STREAM = 2
"""Spawn key of the controls' random stream (the word order, the absent pair, the pseudowords)."""
NONCE_WORDS = ("blicket", "dax", "wug", "toma", "fep", "zav", "tulver", "gazzer")
"""Pseudowords that name nothing (Berko's "wug", Gopnik and Sobel's "blicket", Markman's "dax",
...): in no trained instruction, no colour survey and no English vocabulary."""


def control_rng(seed: int) -> np.random.Generator:
    """The controls' random stream of episode ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(CONTROL_STREAM,)))


def shuffled(instruction: str, seed: int) -> str:
    """``instruction``'s words in another order, drawn from ``seed``'s control stream."""
    words = instruction.split()
    rng = control_rng(seed)
    while True:  # a draw in the original order would be no control; instructions have 4+ words
        order = [words[i] for i in rng.permutation(len(words))]
        if order != words:
            return " ".join(order)


def absent_pair(
    placed: set[tuple[str, str]], pairs: Sequence[tuple[str, str]], seed: int
) -> tuple[tuple[str, str], np.random.Generator]:
    """A (colour, shape) of ``pairs`` not ``placed``, drawn from ``seed``'s control stream, and
    the stream (for the template and words still to draw)."""
    rng = control_rng(seed)
    free = [p for p in pairs if p not in placed]
    return free[int(rng.integers(len(free)))], rng


def nonce_words(seed: int) -> tuple[str, str]:
    """Two different pseudowords (for the colour and the shape), from ``seed``'s control stream."""
    first, second = control_rng(seed).choice(len(NONCE_WORDS), size=2, replace=False)
    return NONCE_WORDS[int(first)], NONCE_WORDS[int(second)]
