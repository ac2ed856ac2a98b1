"""The touch task: seeded layouts, instructions and variants."""

from __future__ import annotations

import pytest

from robots.spec import RobotSpec
from sim_scenes.touch import (
    COLOURS,
    SHAPE_WORDS,
    VARIANTS,
    SceneError,
    available_variants,
    get_variant,
    heldout_variants,
    sample_layout,
)


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


@pytest.mark.parametrize("name", ["touch-mixed", "touch-mixed-clutter", "touch-mixed-shifted"])
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
