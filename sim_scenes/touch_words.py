"""What the words of a touch instruction are worth in its scene: which of them a policy needs.

"Touch the red cube" names its target by colour *and* shape, but a scene may leave one of the
two words redundant: with no other cube on the table, "the cube" is enough. A policy that
ignores a word can still pick the target among the objects that word would have ruled out, by
chance: 1 in the number of objects left (its *candidates*). So success where a word is
*needed* (candidates > 1) is evidence of reading it only above that baseline
(:mod:`stages.evaluate.language` computes it over an evaluation's seeds, through
:meth:`sim_scenes.tasks.TaskFamily.episode_words`, which the touch family answers here).

Word kinds (:data:`sim_scenes.tasks.WORD_KINDS`): ``colour`` (ignoring it leaves the objects of
the target's shape), ``shape`` (the objects of the target's colour), ``both`` (every object: a
policy that reads nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from robots.spec import RobotSpec
from sim_scenes.tasks import WORD_KINDS, EpisodeWords
from sim_scenes.touch import EpisodeLayout, Phrasing, SceneVariant, sample_layout


@dataclass(frozen=True)
class WordCandidates:
    """Objects of one layout that remain candidates for the target when a policy ignores a
    word kind (the target included, so each is >= 1)."""

    colour: int
    """Objects of the target's shape."""
    shape: int
    """Objects of the target's colour."""
    both: int
    """Every object on the table."""

    def of(self, kind: str) -> int:
        """The candidates left when ``kind`` (one of :data:`WORD_KINDS`) is ignored."""
        counts = {"colour": self.colour, "shape": self.shape, "both": self.both}
        return counts[kind]

    def needed(self, kind: str) -> bool:
        """Whether ignoring ``kind`` leaves more than the target (the word tells them apart)."""
        return self.of(kind) > 1

    @property
    def needed_kinds(self) -> tuple[str, ...]:
        """The word kinds this scene needs, in :data:`WORD_KINDS` order."""
        return tuple(k for k in WORD_KINDS if self.needed(k))


def word_candidates(layout: EpisodeLayout) -> WordCandidates:
    """How many of ``layout``'s objects stay candidates for its target per ignored word kind.

    The scene and target alone decide it, whatever the phrasing (an ``absent`` instruction
    names no object, yet the drawn target is still what success is measured against)."""
    target = layout.objects[layout.target]
    return WordCandidates(
        colour=sum(o.shape == target.shape for o in layout.objects),
        shape=sum(o.colour == target.colour for o in layout.objects),
        both=len(layout.objects),
    )


def layout_words(layout: EpisodeLayout) -> EpisodeWords:
    """``layout``'s instruction, its candidates per word kind and the words it played."""
    candidates = word_candidates(layout)
    return EpisodeWords(
        instruction=layout.instruction,
        candidates={kind: candidates.of(kind) for kind in WORD_KINDS},
        played={"colour": layout.colour_word, "shape": layout.shape_word},
    )


def episode_words(
    variant: SceneVariant, robot: RobotSpec, seed: int, phrasing: str
) -> EpisodeWords:
    """The words of ``seed``'s episode of ``variant`` in ``phrasing`` (the layout
    :func:`sim_scenes.touch.sample_layout` draws).

    Raises:
        SceneError: an unknown phrasing (the message lists the valid ones).
    """
    return layout_words(sample_layout(variant, robot, seed, phrasing=cast(Phrasing, phrasing)))
