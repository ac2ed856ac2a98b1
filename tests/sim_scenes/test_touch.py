"""The touch task: seeded layouts, instructions and variants."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

import pytest

from robots.spec import RobotSpec
from sim_scenes.touch import (
    COLOUR_SYNONYMS,
    COLOURS,
    SHAPE_SYNONYMS,
    SHAPE_WORDS,
    TEMPLATES,
    UNSEEN_TEMPLATES,
    VARIANTS,
    EpisodeLayout,
    SceneError,
    available_variants,
    get_variant,
    heldout_variants,
    sample_layout,
)
from stages.dataset.layout import DatasetRef
from stages.dataset.reader import open_dataset


def test_same_seed_same_layout_different_seed_different_layout(rp5: RobotSpec) -> None:
    variant = get_variant("touch-mixed")
    assert sample_layout(variant, rp5, 7) == sample_layout(variant, rp5, 7)
    assert sample_layout(variant, rp5, 7) != sample_layout(variant, rp5, 8)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_layouts_respect_the_variant(rp5: RobotSpec, name: str) -> None:
    variant = get_variant(name)
    for seed in range(50):
        layout = sample_layout(variant, rp5, seed)
        lo, hi = variant.num_objects
        assert lo <= len(layout.objects) <= hi
        pairs = [(o.colour, o.shape) for o in layout.objects]
        assert len(set(pairs)) == len(pairs), "the named object must be unique"
        for a in layout.objects:
            assert a.colour in variant.colours and a.shape in variant.shapes
            assert variant.workspace_x[0] <= a.xy[0] <= variant.workspace_x[1]
            for b in layout.objects:
                if a is not b:
                    dist = ((a.xy[0] - b.xy[0]) ** 2 + (a.xy[1] - b.xy[1]) ** 2) ** 0.5
                    assert dist >= variant.min_separation


def test_instruction_names_the_target_by_colour_and_shape(rp5: RobotSpec) -> None:
    variant = get_variant("touch-mixed")
    phrasings = set()
    for seed in range(100):
        layout = sample_layout(variant, rp5, seed)
        target = layout.objects[layout.target]
        words = layout.instruction.split()
        assert target.colour in words
        assert any(w in words for w in SHAPE_WORDS[target.shape])
        assert not any(c in words for c in COLOURS if c != target.colour)
        phrasings.add(" ".join(words[:2]))
    assert len(phrasings) >= 4, "instruction phrasing should vary"


@pytest.mark.parametrize(
    "name", ["touch-mixed", "touch-mixed-clutter", "touch-mixed-shifted", "touch-mixed-all"]
)
def test_mixed_scenes_always_hold_a_colour_twin(rp5: RobotSpec, name: str) -> None:
    variant = get_variant(name)
    for seed in range(100):
        layout = sample_layout(variant, rp5, seed)
        target = layout.objects[layout.target]
        twins = [o for o in layout.objects if o.colour == target.colour and o is not target]
        assert twins and all(o.shape != target.shape for o in twins), seed


def test_retarget_keeps_the_scene_and_names_another_object(rp5: RobotSpec) -> None:
    variant = get_variant("touch-mixed")
    for seed in range(20):
        layout = sample_layout(variant, rp5, seed)
        other = sample_layout(variant, rp5, seed, retarget=1)
        assert other.objects == layout.objects and other.arm_qpos == layout.arm_qpos
        assert other.target == (layout.target + 1) % len(layout.objects)
        named = other.objects[other.target]
        assert named.colour in other.instruction.split()


def test_heldout_variants_are_reserved_for_evaluation() -> None:
    heldout = available_variants("heldout")
    assert heldout, "the task needs held-out variants"
    for name in heldout:
        assert VARIANTS[name].holdout_for in available_variants("train")
    assert set(heldout_variants("touch-mixed")) <= set(heldout)


def test_unknown_variant_lists_choices() -> None:
    with pytest.raises(
        SceneError, match=r"unknown scene variant 'touch-nothing'; valid choices: .*touch-mixed"
    ):
        get_variant("touch-nothing")


# -- the unseen phrasings (evaluate.phrasing: unseen) ---------------------------------------


def _pattern(template: str) -> re.Pattern[str]:
    """A template as a regex: its words literal, ``{colour}`` and ``{shape}`` any one word."""
    return re.compile(
        re.escape(template).replace(r"\{colour\}", r"\w+").replace(r"\{shape\}", r"\w+")
    )


TRAINED_PATTERNS = [_pattern(t) for t in TEMPLATES]
UNSEEN_PATTERNS = [_pattern(t) for t in UNSEEN_TEMPLATES]
TRAINED_WORDS = (
    {w for t in TEMPLATES for w in t.split() if not w.startswith("{")}
    | set(COLOURS)
    | {w for words in SHAPE_WORDS.values() for w in words}
)
"""Every word a training instruction can contain."""
UNSEEN_WORDS = (
    {w for t in UNSEEN_TEMPLATES for w in t.split() if not w.startswith("{")}
    | {w for words in COLOUR_SYNONYMS.values() for w in words}
    | {w for words in SHAPE_SYNONYMS.values() for w in words}
)
"""Every word an unseen instruction can contain."""


def test_the_unseen_vocabulary_shares_no_template_and_no_word_with_training() -> None:
    assert len(UNSEEN_TEMPLATES) >= 6 and not set(UNSEEN_TEMPLATES) & set(TEMPLATES)
    assert set(COLOUR_SYNONYMS) == set(COLOURS) and set(SHAPE_SYNONYMS) == set(SHAPE_WORDS)
    assert all(len(words) >= 2 for words in [*COLOUR_SYNONYMS.values(), *SHAPE_SYNONYMS.values()])
    synonyms = [w for words in [*COLOUR_SYNONYMS.values(), *SHAPE_SYNONYMS.values()] for w in words]
    assert len(set(synonyms)) == len(synonyms), "a synonym must name one colour or shape"
    assert not UNSEEN_WORDS & TRAINED_WORDS


def test_the_training_data_holds_no_unseen_template_or_word(tiny_dataset: DatasetRef) -> None:
    """Every task string of a collected dataset is a trained phrasing: it matches a training
    template and contains no word of the unseen vocabulary."""
    tasks = open_dataset(tiny_dataset.path, check_videos=False).tasks
    assert tasks
    for task in tasks:
        assert any(p.fullmatch(task) for p in TRAINED_PATTERNS), task
        assert not any(p.fullmatch(task) for p in UNSEEN_PATTERNS), task
        assert not set(task.split()) & UNSEEN_WORDS, task


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_unseen_instructions_name_the_target_in_words_training_never_uses(
    rp5: RobotSpec, name: str
) -> None:
    variant = get_variant(name)
    templates, words = set(), set()
    for seed in range(300):
        layout = sample_layout(variant, rp5, seed, phrasing="unseen")
        text, target = layout.instruction, layout.objects[layout.target]
        assert not any(p.fullmatch(text) for p in TRAINED_PATTERNS), text
        assert not set(text.split()) & TRAINED_WORDS, text
        assert set(text.split()) & set(COLOUR_SYNONYMS[target.colour]), text
        assert set(text.split()) & set(SHAPE_SYNONYMS[target.shape]), text
        templates |= {i for i, p in enumerate(UNSEEN_PATTERNS) if p.fullmatch(text)}
        words |= set(text.split())
    assert templates == set(range(len(UNSEEN_TEMPLATES))), "every unseen template is drawn"
    shapes = {w for s in variant.shapes for w in SHAPE_SYNONYMS[s]}
    assert shapes <= words, "every synonym of the variant's shapes is drawn"


def test_trained_phrasing_draws_exactly_what_it_drew_before_unseen_existed(
    rp5: RobotSpec,
) -> None:
    """Pinned before ``phrasing`` existed: the default and ``trained`` give the same scene,
    target and instruction for every seed, bit for bit (the variants there were then: a new
    one, such as touch-single or touch-mixed-all, draws its own; the fields added since, the
    words played, are left out of the digest)."""
    new = ("touch-single", "touch-mixed-all")
    pinned = [name for name in sorted(VARIANTS) if not name.startswith(new)]
    digest = hashlib.sha256()
    for name in pinned:
        for seed in (0, 1, 7, 123456789):
            layout = sample_layout(VARIANTS[name], rp5, seed)
            assert sample_layout(VARIANTS[name], rp5, seed, phrasing="trained") == layout
            then = re.sub(r", colour_word=.*\)$", ")", repr(layout))
            digest.update(then.encode())
    mixed = get_variant("touch-mixed")
    assert [sample_layout(mixed, rp5, s).instruction for s in (0, 1, 7)] == [
        "touch the blue block",
        "move to the green ball",
        "move to the yellow ball",
    ]
    assert digest.hexdigest() == "d8730aaf588343370ed39dc163fc0c0754201a4fe22098aa6781d7a2bb0c691b"


def scene(layout: EpisodeLayout) -> EpisodeLayout:
    """``layout`` without its wording: the scene and target a phrasing must keep."""
    return replace(layout, instruction="", colour_word="", shape_word="")


@pytest.mark.parametrize("retarget", [0, 1])
def test_unseen_phrasing_keeps_the_scene_and_target_of_the_seed(
    rp5: RobotSpec, retarget: int
) -> None:
    variant = get_variant("touch-mixed-clutter")
    instructions = set()
    for seed in range(50):
        trained = sample_layout(variant, rp5, seed, retarget)
        unseen = sample_layout(variant, rp5, seed, retarget, phrasing="unseen")
        assert scene(unseen) == scene(trained)
        assert unseen == sample_layout(variant, rp5, seed, retarget, phrasing="unseen")
        instructions.add(unseen.instruction)
    assert len(instructions) > 20, "the unseen wording varies with the seed"
    with pytest.raises(
        SceneError,
        match="unknown phrasing 'novel'; valid choices: trained, unseen, unseen-template",
    ):
        sample_layout(variant, rp5, 0, phrasing="novel")  # type: ignore[arg-type]


def test_the_default_vlas_tokenizer_knows_no_unseen_colour_word() -> None:
    """What the comparison of issue 39 relies on: the word-level tokenizer trained on the task
    family maps every colour synonym to [UNK] (and every trained colour to a word of its own)."""
    from sim_scenes.touch_task import TOUCH
    from stages.policy.tokenizer import UNK, InstructionTokenizer

    tokenizer = InstructionTokenizer.train(TOUCH.instructions())
    unk = tokenizer.tokenizer.token_to_id(UNK)
    unseen = [w for words in COLOUR_SYNONYMS.values() for w in words]
    ids, mask = tokenizer(unseen)
    assert mask.sum(axis=1).tolist() == [1] * len(unseen)  # one word, one token
    assert ids[:, 0].tolist() == [unk] * len(unseen)
    trained, _ = tokenizer(list(COLOURS))
    assert unk not in trained[:, 0].tolist()


@pytest.mark.parametrize("part", ["template", "colour", "shape"])
def test_a_partial_unseen_phrasing_changes_only_its_part(rp5: RobotSpec, part: str) -> None:
    """``unseen-<part>`` words the instruction as ``trained`` does except for that part, which
    is the one ``unseen`` uses: the scene, the target and the other two parts stay."""
    variant = get_variant("touch-mixed")
    for seed in range(60):
        trained = sample_layout(variant, rp5, seed)
        unseen = sample_layout(variant, rp5, seed, phrasing="unseen")
        partial = sample_layout(variant, rp5, seed, phrasing=f"unseen-{part}")  # type: ignore[arg-type]
        assert scene(partial) == scene(trained)
        target = trained.objects[trained.target]
        words = partial.instruction.split()
        colour_new = any(w in COLOUR_SYNONYMS[target.colour] for w in words)
        shape_new = any(w in SHAPE_SYNONYMS[target.shape] for w in words)
        template_new = any(p.fullmatch(partial.instruction) for p in UNSEEN_PATTERNS)
        assert (template_new, colour_new, shape_new) == (
            part == "template",
            part == "colour",
            part == "shape",
        ), partial.instruction
        assert (target.colour in words) == (part != "colour")
        new_word = {w for w in words if w in UNSEEN_WORDS} - set(trained.instruction.split())
        assert new_word <= set(unseen.instruction.split()), "the unseen draw's own words"
