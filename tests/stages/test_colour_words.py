"""Colour words read through the xkcd colour survey (``policy.colour_words: xkcd``): the lexicon,
the readings, and the tokenizer that carries them to training, evaluation and the edge."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim_scenes.touch import COLOUR_SYNONYMS, COLOURS
from stages.policy.checkpoint import load_policy, new_policy, save_new_policy
from stages.policy.colour_words import lexicon, readings, srgb_to_lab
from stages.policy.config import PolicyConfig
from stages.policy.pretrained import PretrainedVLA


def _policy(colour_words: str = "xkcd") -> PretrainedVLA:
    cfg = PolicyConfig(type="pretrained", colour_words=colour_words)  # type: ignore[arg-type]
    policy, _ = new_policy(cfg, ["scene"], 64, "rp5", 6, 6)
    assert isinstance(policy, PretrainedVLA)
    return policy


def test_srgb_to_lab_matches_the_cie_reference_values() -> None:
    """White, black and sRGB's primaries against the published CIELAB (D65) values / 100."""
    rgb = np.array([[1.0, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    expected = np.array(
        [
            [1.0, 0, 0],
            [0, 0, 0],
            [0.5324, 0.8009, 0.6720],
            [0.8774, -0.8618, 0.8318],
            [0.3230, 0.7919, -1.0786],
        ]
    )
    np.testing.assert_allclose(srgb_to_lab(rgb), expected, atol=6e-3)


def test_the_survey_names_colours_and_no_shape_or_verb() -> None:
    words = lexicon("xkcd")
    assert len(words) > 200
    for colour in ("crimson", "scarlet", "emerald", "azure", "navy", "golden", "teal", "lilac"):
        assert colour in words
    for word in ("touch", "the", "cube", "ball", "box", "orb", "tin", "press", "that"):
        assert word not in words
    assert lexicon("none") == {}
    with pytest.raises(ValueError, match="valid choices: xkcd, none"):
        lexicon("pantone")


def test_every_unseen_colour_word_reads_as_its_own_colour_by_hue() -> None:
    """With touch's six colours known, each of the twelve synonyms no demonstration uses reads
    as the colour it is a synonym of (the survey's hue decides, not this project's tables);
    known words are never replaced; greys find no chromatic word to be read as."""
    known = set(COLOURS)
    read = readings("xkcd", known)
    for colour, synonyms in COLOUR_SYNONYMS.items():
        for word in synonyms:
            assert read[word] == colour, f"{word} read as {read[word]}, not {colour}"
    assert not known & set(read)
    assert "grey" not in read and "white" not in read
    assert read["cherry"] == "red" and read["cerulean"] == "blue" and read["forest"] == "green"
    assert readings("xkcd", {"cube", "ball"}) == {}  # no colour known: nothing to read as
    assert readings("none", known) == {}


def test_the_policy_tokenizer_reads_a_synonym_as_its_colour_through_save_and_load(
    tmp_path: Path,
) -> None:
    """ "touch the Crimson cube" tokenizes as "touch the red cube" in a new policy, in the same
    policy saved and loaded, and in the saved tokenizer.json as the edge runtime's `tokenizers`
    reads it; a word that only contains a colour ("crimsonish") is left alone."""
    from tokenizers import Tokenizer

    policy = _policy()
    red = policy.tokenizer(["touch the red cube"])[0]
    np.testing.assert_array_equal(policy.tokenizer(["touch the Crimson cube"])[0], red)
    pieces = policy.tokenizer.tokenizer.tokenize("a crimsonish azure block")  # type: ignore[attr-defined]
    assert pieces[:3] == ["a", "crimson", "##ish"] and "blue" in pieces
    checkpoint = save_new_policy(PolicyConfig(type="pretrained"), ["scene"], 64, tmp_path / "c")
    loaded = load_policy(checkpoint)
    np.testing.assert_array_equal(loaded.tokenizer(["touch the crimson cube"])[0], red)
    edge = Tokenizer.from_file(str(next(Path(checkpoint).rglob("tokenizer.json"))))
    edge_ids = [i for i in edge.encode("touch the crimson cube").ids if i != 0]  # unpadded
    assert edge_ids == red[0][red[0] != 0].tolist()


def test_without_colour_words_the_sentence_encoder_reads_them() -> None:
    """``colour_words: none`` (and a checkpoint saved before the field): "crimson" stays
    "crimson"."""
    policy = _policy("none")
    crimson, red = policy.tokenizer(["touch the crimson cube", "touch the red cube"])[0]
    assert not np.array_equal(crimson, red)
