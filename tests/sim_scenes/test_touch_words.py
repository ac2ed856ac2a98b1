"""Which words of a touch instruction a scene needs, the words played, the corrupted controls
(``shuffled``, ``absent``) and touch-mixed-all, where every colour and shape is played."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from robots.spec import RobotSpec
from sim_scenes.tasks import WORD_KINDS, EpisodeWords, task_family
from sim_scenes.touch import (
    COLOUR_SYNONYMS,
    COLOURS,
    PHRASINGS,
    SHAPE_SYNONYMS,
    SHAPE_WORDS,
    SHAPES,
    TEMPLATES,
    EpisodeLayout,
    PlacedObject,
    SceneError,
    get_variant,
    heldout_variants,
    sample_layout,
)
from sim_scenes.touch_words import layout_words


def layout(objects: list[tuple[str, str]], target: int = 0) -> EpisodeLayout:
    """A hand-built layout of ``(colour, shape)`` objects; only what the words depend on."""
    placed = tuple(
        PlacedObject(c, s, (0.3 + 0.1 * i, 0.0), 0.0) for i, (c, s) in enumerate(objects)
    )
    return EpisodeLayout(0, placed, target, "", (), (0.0, 0.0, 1.0), 0.5, (0.0, 0.0, 0.0))


@pytest.mark.parametrize(
    ("objects", "expected", "needed"),
    [
        # The colour twin only: the shape word tells the two apart, the colour word nothing.
        ([("red", "cube"), ("red", "ball"), ("blue", "ball")], (1, 2, 3), ("shape", "both")),
        # A second cube: now "red" is needed too (2 cubes), and "cube" (2 red objects).
        (
            [("red", "cube"), ("red", "ball"), ("blue", "cube")],
            (2, 2, 3),
            ("colour", "shape", "both"),
        ),
        # Three cubes of other colours: the colour word alone tells them apart.
        ([("red", "cube"), ("blue", "cube"), ("green", "cube")], (3, 1, 3), ("colour", "both")),
        # One object: no word is needed.
        ([("red", "cube")], (1, 1, 1), ()),
    ],
)
def test_word_candidates_count_the_objects_a_word_rules_out(
    objects: list[tuple[str, str]], expected: tuple[int, int, int], needed: tuple[str, ...]
) -> None:
    words = layout_words(layout(objects))
    assert dict(words.candidates) == dict(zip(("colour", "shape", "both"), expected, strict=True))
    assert tuple(k for k in WORD_KINDS if words.needed(k)) == needed


def test_word_candidates_follow_the_target() -> None:
    objects = [("red", "cube"), ("red", "ball"), ("blue", "cube"), ("green", "cylinder")]
    counts = {"colour": 1, "shape": 1, "both": 4}
    assert dict(layout_words(layout(objects, target=3)).candidates) == counts
    assert dict(layout_words(layout(objects, target=2)).candidates) == counts | {"colour": 2}


COLOUR_WORDS = {*COLOURS, *(w for ws in COLOUR_SYNONYMS.values() for w in ws)}
SHAPE_NAMES = {w for ws in [*SHAPE_WORDS.values(), *SHAPE_SYNONYMS.values()] for w in ws}


@pytest.mark.parametrize("phrasing", PHRASINGS)
def test_the_layout_records_the_colour_and_shape_words_its_instruction_plays(
    rp5: RobotSpec, phrasing: str
) -> None:
    variant = get_variant("touch-mixed")
    for seed in range(40):
        drawn = sample_layout(variant, rp5, seed, phrasing=phrasing)  # type: ignore[arg-type]
        words = drawn.instruction.split()
        assert drawn.colour_word in words and drawn.shape_word in words, drawn
        if phrasing != "nonce":  # pseudowords: the next tests
            assert drawn.colour_word in COLOUR_WORDS and drawn.shape_word in SHAPE_NAMES


def test_the_shuffled_control_keeps_the_scene_and_target_and_plays_the_trained_words(
    rp5: RobotSpec,
) -> None:
    variant = get_variant("touch-mixed-clutter")
    orders = set()
    for seed in range(100):
        trained = sample_layout(variant, rp5, seed)
        shuffled = sample_layout(variant, rp5, seed, phrasing="shuffled")
        assert replace(shuffled, instruction=trained.instruction) == trained, seed
        assert Counter(shuffled.instruction.split()) == Counter(trained.instruction.split())
        assert shuffled.instruction != trained.instruction, "another order every time"
        assert shuffled == sample_layout(variant, rp5, seed, phrasing="shuffled")
        orders.add(
            tuple(trained.instruction.split().index(w) for w in shuffled.instruction.split())
        )
    assert len(orders) > 30, "the order is drawn per seed, not one fixed permutation"


@pytest.mark.parametrize(
    "name", ["touch-mixed", "touch-mixed-clutter", "touch-cubes", "touch-single"]
)
def test_the_absent_control_names_a_pair_on_no_object_in_trained_words(
    rp5: RobotSpec, name: str
) -> None:
    variant = get_variant(name)
    named = set()
    for seed in range(200):
        trained = sample_layout(variant, rp5, seed)
        absent = sample_layout(variant, rp5, seed, phrasing="absent")
        assert replace(absent, instruction="", colour_word="", shape_word="") == replace(
            trained, instruction="", colour_word="", shape_word=""
        ), "the same scene and target"
        shape = next(s for s, words in SHAPE_WORDS.items() if absent.shape_word in words)
        assert (absent.colour_word, shape) not in {(o.colour, o.shape) for o in absent.objects}
        assert absent.colour_word in variant.colours and shape in variant.shapes
        assert any(
            t.format(colour=absent.colour_word, shape=absent.shape_word) == absent.instruction
            for t in TEMPLATES
        ), absent.instruction
        named.add((absent.colour_word, shape))
    assert len(named) >= min(6, len(variant.colours) * len(variant.shapes)), "drawn per seed"


def test_touch_mixed_all_plays_every_colour_shape_and_synonym(rp5: RobotSpec) -> None:
    variant = get_variant("touch-mixed-all")
    assert variant.split == "heldout" and variant.holdout_for == "touch-mixed"
    assert "touch-mixed-all" not in heldout_variants("touch-mixed"), "named, not by default"
    objects, words = set(), Counter[str]()
    for seed in range(200):
        drawn = sample_layout(variant, rp5, seed, phrasing="unseen")
        objects |= {(o.colour, o.shape) for o in drawn.objects}
        words.update([drawn.colour_word, drawn.shape_word])
    assert {c for c, _ in objects} == set(COLOURS) and {s for _, s in objects} == set(SHAPES)
    synonyms = {w for ws in [*COLOUR_SYNONYMS.values(), *SHAPE_SYNONYMS.values()] for w in ws}
    assert set(words) == synonyms, synonyms - set(words)
    mixed = {
        sample_layout(get_variant("touch-mixed"), rp5, s, phrasing="unseen").colour_word
        for s in range(200)
    }
    assert not mixed & {*COLOUR_SYNONYMS["purple"], *COLOUR_SYNONYMS["cyan"]}, "why it exists"


def test_the_touch_family_answers_the_task_seam_with_its_layouts_words(rp5: RobotSpec) -> None:
    """:meth:`TaskFamily.episode_words` of touch: the seed's instruction in the phrasing, the
    candidates per word kind of its layout, the colour and shape words it played."""
    touch = task_family("touch")
    mixed = get_variant("touch-mixed")
    for seed in range(20):
        drawn = sample_layout(mixed, rp5, seed, phrasing="absent")
        words = touch.episode_words("touch-mixed", rp5, seed, "absent")
        assert words == layout_words(drawn)
        assert words.instruction == drawn.instruction
        target = drawn.objects[drawn.target]
        assert words.candidates["colour"] == sum(o.shape == target.shape for o in drawn.objects)
        assert words.candidates["both"] == len(drawn.objects)
        assert dict(words.played) == {"colour": drawn.colour_word, "shape": drawn.shape_word}
    with pytest.raises(SceneError, match="unknown phrasing 'novel'"):
        touch.episode_words("touch-mixed", rp5, 0, "novel")
    with pytest.raises(SceneError, match="unknown scene variant"):
        touch.episode_words("touch-nowhere", rp5, 0, "trained")


def test_another_family_has_no_episode_words(rp5: RobotSpec) -> None:
    metaworld = task_family("metaworld")
    assert metaworld.episode_words(metaworld.variant_names()[0], rp5, 0, "trained") is None


def test_episode_words_state_every_kind_they_count() -> None:
    words = EpisodeWords("touch the red cube", {"colour": 2, "both": 3}, {"colour": "red"})
    assert words.needed("colour") and not words.needed("shape"), "a kind left out: not needed"
    with pytest.raises(ValueError, match="candidates need 'both'"):
        EpisodeWords("touch the red cube", {"colour": 2}, {"colour": "red"})
    with pytest.raises(ValueError, match="one of colour, shape, both"):
        EpisodeWords("x", {"size": 2, "both": 3}, {})
    with pytest.raises(ValueError, match="the target is a candidate"):
        EpisodeWords("x", {"colour": 0, "both": 3}, {})


def test_the_nonce_control_names_nothing_in_the_trained_template(rp5: RobotSpec) -> None:
    """Pseudowords for colour and shape, two different ones, in the seed's trained template;
    the scene and target are the trained phrasing's; no colour or shape word of any phrasing
    (trained or unseen) is among them."""
    from sim_scenes.touch_controls import NONCE_WORDS

    known = set(COLOUR_WORDS) | set(SHAPE_NAMES) | set(SHAPE_WORDS)
    known |= {w for words in (*COLOUR_SYNONYMS.values(), *SHAPE_SYNONYMS.values()) for w in words}
    assert not known & set(NONCE_WORDS)
    variant = get_variant("touch-mixed")
    pairs = set()
    for seed in range(100):
        trained = sample_layout(variant, rp5, seed)
        nonce = sample_layout(variant, rp5, seed, phrasing="nonce")
        blank = replace(nonce, instruction=trained.instruction, colour_word="", shape_word="")
        assert blank == replace(trained, colour_word="", shape_word=""), "the same scene, target"
        assert nonce.colour_word != nonce.shape_word
        assert {nonce.colour_word, nonce.shape_word} <= set(NONCE_WORDS)
        template = trained.instruction.replace(trained.colour_word, "{colour}", 1)
        template = template.replace(trained.shape_word, "{shape}", 1)
        assert nonce.instruction == template.format(
            colour=nonce.colour_word, shape=nonce.shape_word
        )
        pairs.add((nonce.colour_word, nonce.shape_word))
    assert len(pairs) > 20, "drawn per seed"
