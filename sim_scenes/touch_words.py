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

from typing import cast

from robots.spec import RobotSpec
from sim_scenes.tasks import EpisodeWords
from sim_scenes.touch import EpisodeLayout, Phrasing, SceneVariant, sample_layout


def layout_words(layout: EpisodeLayout) -> EpisodeWords:
    """``layout``'s instruction, the objects that stay candidates for its target per ignored
    word kind, and the words it played.

    The scene and target alone decide the candidates, whatever the phrasing (an ``absent``
    instruction names no object, yet the drawn target is still what success is measured
    against): ignoring the colour word leaves the objects of the target's shape, ignoring the
    shape word those of its colour, ignoring both every object."""
    target = layout.objects[layout.target]
    return EpisodeWords(
        instruction=layout.instruction,
        candidates={
            "colour": sum(o.shape == target.shape for o in layout.objects),
            "shape": sum(o.colour == target.colour for o in layout.objects),
            "both": len(layout.objects),
        },
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
