"""Colour words grounded in colour, not in text statistics (``policy.colour_words``).

A sentence encoder learns "crimson" from the sentences it was trained on, not from what crimson
looks like: all-MiniLM-L6-v2 puts "touch the golden cube" nearer "touch the green cube" than
"touch the yellow cube" (docs/benchmarks.md). So the ``pretrained`` policy reads colour words
through a lexicon of what colours look like instead -- the xkcd colour survey (949 names, each
the sRGB colour that survey's 222,500 people gave it; it ships inside matplotlib as
``matplotlib.colors.XKCD_COLORS``), chosen by nobody here and not tuned to any task's
vocabulary:

- every one-word colour name becomes one token of the policy's tokenizer (those the sentence
  encoder splits into pieces are added whole: "teal", "lilac");
- the instruction encoder replaces a colour word with the sentence encoder's mask token, so
  the colour reaches the policy only as its CIELAB value (:func:`colour_table`), beside the
  sentence encoder's features: the words around it stay the sentence encoder's;
- the vision adapter scores every pixel by how close its hue is to the named colour's
  (:func:`hue_match`), one more feature channel the instruction conditions.

A word the survey names is read as a colour wherever it stands ("olive", "rose"). Units: CIELAB
(D65) divided by 100 (L in [0, 1], a and b about [-1, 1]).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

LEXICONS = ("xkcd", "none")
"""``policy.colour_words`` values: the xkcd survey's names, or none (colour words are plain
words of the sentence encoder)."""
COLOUR_FEATURES = 4
"""Per token: L, a, b (CIELAB / 100) of the colour it names, and 1 if it names one (else 0s)."""
HUE_SHARPNESS = 16.0
"""How fast the hue match falls with the angle between hues: exp(16 (cos - 1)) is 0.37 at
18 degrees (blue against purple), 0.003 at 40 degrees."""
GREY_CHROMA = 0.15
"""CIELAB chroma / 100 under which a pixel (or a colour) counts as partly grey: its hue match
is scaled by chroma / 0.15 (a grey table has no hue to match)."""

_SRGB_TO_XYZ = np.array(
    [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
) / np.array([[0.95047], [1.0], [1.08883]])
"""sRGB (linear) to XYZ, each row divided by the D65 white point's component."""


def srgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """sRGB in [0, 1], channels last ``(..., 3)`` -> CIELAB / 100 ``(..., 3)`` (D65)."""
    linear = torch.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = linear @ torch.as_tensor(_SRGB_TO_XYZ.T, dtype=rgb.dtype)
    f = torch.where(xyz > 0.008856, xyz.clamp(min=1e-6) ** (1.0 / 3.0), 7.787 * xyz + 16 / 116)
    fx, fy, fz = f.unbind(-1)
    return torch.stack([1.16 * fy - 0.16, 5.0 * (fx - fy), 2.0 * (fy - fz)], dim=-1)


@cache
def lexicon(name: str) -> dict[str, tuple[float, float, float]]:
    """One-word colour names -> CIELAB / 100, for ``policy.colour_words`` = ``name``."""
    if name == "none":
        return {}
    if name != "xkcd":
        raise ValueError(f"unknown colour lexicon {name!r}; valid choices: {', '.join(LEXICONS)}")
    from matplotlib.colors import XKCD_COLORS, to_rgb

    words = {k.removeprefix("xkcd:"): v for k, v in XKCD_COLORS.items()}
    words = {w: v for w, v in words.items() if w.isalpha()}  # one word, no "/" or "'"
    rgb = torch.tensor([to_rgb(v) for v in words.values()], dtype=torch.float64)
    labs = srgb_to_lab(rgb).tolist()
    return {w: (lab[0], lab[1], lab[2]) for w, lab in zip(words, labs, strict=True)}


def add_colour_tokens(tokenizer: Any, name: str) -> None:
    """Make every colour word of lexicon ``name`` one token of the ``transformers`` tokenizer
    (whole words only: "teal" is a token, "steal" stays the pieces it was)."""
    from transformers import AddedToken

    vocab = tokenizer.get_vocab()
    missing = sorted(w for w in lexicon(name) if w not in vocab)
    if missing:
        tokenizer.add_tokens([AddedToken(w, single_word=True) for w in missing])


def colour_table(tokenizer: Any, name: str) -> torch.Tensor:
    """``(vocab, COLOUR_FEATURES)`` float32: row ``i`` is token ``i``'s colour (L, a, b, 1) if
    it is a whole colour word of lexicon ``name``, else zeros."""
    table = torch.zeros(len(tokenizer), COLOUR_FEATURES)
    words = lexicon(name)
    for token, i in tokenizer.get_vocab().items():
        if token in words:
            table[i, :3] = torch.tensor(words[token])
            table[i, 3] = 1.0
    return table


def hue_match(pixels: torch.Tensor, colour: torch.Tensor, side: int) -> torch.Tensor:
    """How much of each cell of a ``side`` x ``side`` grid over the image has the named hue.

    Args:
        pixels: float ``(B, 3, H, W)`` sRGB in [0, 1].
        colour: ``(B, COLOUR_FEATURES)`` the instruction's colour (zeros: it names none).
        side: the grid's side (the feature map's).

    Returns:
        ``(B, 1, side, side)`` in [0, 1]: per pixel exp(HUE_SHARPNESS (cos - 1)) of the angle
        between its hue and the colour's, scaled down for greys, averaged over each cell.
    """
    lab = srgb_to_lab(pixels.permute(0, 2, 3, 1))  # (B, H, W, 3)
    ab, target = lab[..., 1:], colour[:, None, None, 1:3]
    pixel_chroma = ab.norm(dim=-1)
    target_chroma = target.norm(dim=-1)
    cos = (ab * target).sum(-1) / (pixel_chroma * target_chroma).clamp(min=1e-6)
    grey = (pixel_chroma / GREY_CHROMA).clamp(max=1.0) * (target_chroma / GREY_CHROMA).clamp(
        max=1.0
    )
    match = torch.exp(HUE_SHARPNESS * (cos - 1.0)) * grey * colour[:, None, None, 3]
    height, width = match.shape[1:]
    cell = -(-height // side)
    padded = F.pad(match[:, None], (0, cell * side - width, 0, cell * side - height))
    return F.avg_pool2d(padded, cell)
