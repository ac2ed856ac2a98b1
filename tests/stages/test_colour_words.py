"""Colour words read as colours (``policy.colour_words: xkcd``): the lexicon, the tokens, the
instruction encoder's masking and the vision adapter's hue map."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.policy.checkpoint import new_policy
from stages.policy.colour_words import hue_match, lexicon, srgb_to_lab
from stages.policy.config import PolicyConfig
from stages.policy.hub_vla import HubTokenizer
from stages.policy.pretrained import TEXT_WIDTH, PretrainedVLA, VisionAdapter


def _policy(colour_words: str = "xkcd") -> PretrainedVLA:
    cfg = PolicyConfig(type="pretrained", colour_words=colour_words)  # type: ignore[arg-type]
    policy, _ = new_policy(cfg, ["scene"], 64, "rp5", 6, 6)
    assert isinstance(policy, PretrainedVLA)
    return policy


def test_srgb_to_lab_matches_the_cie_reference_values() -> None:
    """White, black and sRGB's primaries against the published CIELAB (D65) values / 100."""
    rgb = torch.tensor(
        [[1.0, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=torch.float64
    )
    expected = torch.tensor(
        [
            [1.0, 0, 0],
            [0, 0, 0],
            [0.5324, 0.8009, 0.6720],
            [0.8774, -0.8618, 0.8318],
            [0.3230, 0.7919, -1.0786],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(srgb_to_lab(rgb), expected, atol=6e-3, rtol=0)


def test_the_survey_names_the_colours_no_demonstration_used_and_no_shape_or_verb() -> None:
    words = lexicon("xkcd")
    assert len(words) > 200
    for colour in ("crimson", "scarlet", "emerald", "azure", "navy", "golden", "teal", "lilac"):
        assert colour in words
    for word in ("touch", "the", "cube", "ball", "box", "orb", "tin", "press", "that"):
        assert word not in words
    assert lexicon("none") == {}
    with pytest.raises(ValueError, match="valid choices: xkcd, none"):
        lexicon("pantone")


def test_a_colour_word_is_one_token_and_reaches_the_sentence_encoder_masked() -> None:
    """ "teal" (two word pieces for the sentence encoder) is one token, "steal" is not touched;
    "crimson" and "red" give the same 384 sentence-encoder features (both are the mask token)
    and differ only in the colour columns, which hold their CIELAB values."""
    policy = _policy()
    assert isinstance(policy.tokenizer, HubTokenizer)
    pieces = policy.tokenizer.tokenizer.tokenize("the teal ball steals")
    assert pieces[:3] == ["the", "teal", "ball"] and "teal" not in pieces[3:]
    texts = ["touch the red cube", "touch the crimson cube", "touch the blue cube"]
    tokens, mask = (torch.as_tensor(a) for a in policy.tokenizer(texts))
    features = policy.encode_instruction(tokens, mask)
    assert features.shape[-1] == TEXT_WIDTH + 4
    torch.testing.assert_close(features[0, :, :TEXT_WIDTH], features[1, :, :TEXT_WIDTH])
    torch.testing.assert_close(features[0, :, :TEXT_WIDTH], features[2, :, :TEXT_WIDTH])
    named = features[..., TEXT_WIDTH:].sum(1)  # one colour word each
    assert named[:, 3].tolist() == [1.0, 1.0, 1.0]
    red, crimson, blue = (named[i, 1:3] for i in range(3))
    cos = torch.nn.functional.cosine_similarity
    assert cos(crimson, red, dim=0) > 0.95 > 0 > cos(crimson, blue, dim=0)


def test_without_colour_words_the_sentence_encoder_reads_them() -> None:
    """``colour_words: none`` (and a checkpoint saved before the field): 384 features, and the
    colour word changes them."""
    policy = _policy("none")
    tokens, mask = (
        torch.as_tensor(a)
        for a in policy.tokenizer(["touch the red cube", "touch the crimson cube"])
    )
    features = policy.encode_instruction(tokens, mask)
    assert features.shape[-1] == TEXT_WIDTH
    assert not torch.allclose(features[0], features[1])


def test_the_hue_map_finds_the_named_colour_and_ignores_grey() -> None:
    """A 64 px image: a dark red patch top left, a blue one bottom right, grey elsewhere. The map
    for "crimson" lights the red cells, not the blue or grey ones; "navy" the reverse; an
    instruction that names no colour gives zeros."""
    image = np.full((1, 64, 64, 3), 0.5, np.float32)
    image[0, :16, :16] = (0.5, 0.05, 0.05)  # red in shadow
    image[0, 48:, 48:] = (0.1, 0.2, 0.9)
    pixels = torch.as_tensor(image).permute(0, 3, 1, 2)
    words = lexicon("xkcd")

    def colour(word: str) -> torch.Tensor:
        return torch.tensor([[*words[word], 1.0]], dtype=torch.float32)

    crimson = hue_match(pixels, colour("crimson"), 8)[0, 0]
    navy = hue_match(pixels, colour("navy"), 8)[0, 0]
    assert crimson.shape == (8, 8)
    assert (
        crimson[:2, :2].min() > 0.8
        and crimson[6:, 6:].max() < 0.01
        and crimson[3:5, 3:5].max() < 0.01
    )
    assert navy[6:, 6:].min() > 0.5 and navy[:2, :2].max() < 0.01
    assert hue_match(pixels, torch.zeros(1, 4), 8).abs().max() == 0


def test_the_colour_reaches_the_policy_through_the_vision_path() -> None:
    """With the colour columns of the word tokens cut (text projection weights 0), "red" and
    "blue" still change the policy's features, through the hue map channel alone; with that
    channel's weights 0 as well, they do not."""
    torch.manual_seed(0)
    policy = _policy().eval()
    image = torch.randint(0, 255, (1, 64, 64, 3), dtype=torch.uint8).expand(2, -1, -1, -1)
    texts = ["touch the red cube", "touch the blue cube"]
    tokens, mask = (torch.as_tensor(a) for a in policy.tokenizer(texts))
    adapter = policy.adapters["scene"]
    assert isinstance(adapter, VisionAdapter)

    def features() -> torch.Tensor:
        with torch.no_grad():
            return policy.encode({"scene": image}, torch.zeros(2, 6), tokens, mask)[0]

    with torch.no_grad():
        policy.text_proj.weight[:, TEXT_WIDTH:] = 0.0
        adapter.reduce.weight[:, -1] = 1.0
    through_vision = features()
    assert not torch.allclose(through_vision[0], through_vision[1])
    with torch.no_grad():
        adapter.reduce.weight[:, -1] = 0.0
    cut = features()
    torch.testing.assert_close(cut[0], cut[1])
