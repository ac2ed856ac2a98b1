"""Colour words grounded in what colours look like, not in text statistics
(``policy.colour_words``).

A sentence encoder learns "crimson" from the sentences it was trained on, not from what crimson
looks like: all-MiniLM-L6-v2 puts "touch the golden cube" nearer "touch the green cube" than
"touch the yellow cube" (docs/benchmarks.md), so a policy on it guesses at colour words its
demonstrations never used. The ``pretrained`` policy therefore reads a colour word through a
lexicon of what colours look like -- the xkcd colour survey (949 names, each the sRGB colour
that survey's 222,500 respondents gave it; it ships inside matplotlib as
``matplotlib.colors.XKCD_COLORS``), chosen by nobody here and not tuned to any task's words:

- the *known* colour words are those of the task's training instructions (touch: red, green,
  blue, yellow, purple, cyan);
- every other one-word name of the survey is read as the known word nearest in hue (the angle
  in CIELAB's a-b plane; by CIELAB distance for greys): "crimson" as "red", "azure" as "blue",
  "teal" as "cyan";
- the reading is a normaliser of the policy's tokenizer (``tokenizer.json``: one regex
  replacement per known word), so training, evaluation and the edge device's runtime read an
  instruction the same way, with no code of ours on the device.

A word the survey names is read as a colour wherever it stands ("olive", "rose"); a known word
is never replaced. Units: CIELAB (D65) divided by 100.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache
from typing import Any

import numpy as np

LEXICONS = ("xkcd", "none")
"""``policy.colour_words`` values: the xkcd survey's names, or none (colour words are plain
words of the sentence encoder)."""
GREY_CHROMA = 0.1
"""CIELAB chroma / 100 under which a colour has no hue to speak of (greys, black, white): it
is matched by CIELAB distance instead, and only to a known word that is grey too."""

_SRGB_TO_XYZ = np.array(
    [[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]
) / np.array([[0.95047], [1.0], [1.08883]])
"""sRGB (linear) to XYZ, each row divided by the D65 white point's component."""


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB in [0, 1], channels last ``(..., 3)`` -> CIELAB / 100 ``(..., 3)`` (D65)."""
    rgb = np.asarray(rgb, np.float64)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = linear @ _SRGB_TO_XYZ.T
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    fx, fy, fz = f[..., 0], f[..., 1], f[..., 2]
    return np.stack([1.16 * fy - 0.16, 5.0 * (fx - fy), 2.0 * (fy - fz)], axis=-1)


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
    labs = srgb_to_lab(np.array([to_rgb(v) for v in words.values()])).tolist()
    return {w: (lab[0], lab[1], lab[2]) for w, lab in zip(words, labs, strict=True)}


def readings(name: str, known: Iterable[str]) -> dict[str, str]:
    """Each colour word of lexicon ``name`` that is not ``known`` -> the known word it is read
    as (nearest hue; greys to the nearest grey known word, else left alone). Known words the
    lexicon lacks are ignored; none known: nothing is read."""
    words = lexicon(name)
    anchors = {w: words[w] for w in sorted(set(known)) if w in words}
    out: dict[str, str] = {}
    for word, lab in words.items():
        if word in anchors:
            continue
        best = _nearest(lab, anchors)
        if best is not None:
            out[word] = best
    return out


def _nearest(
    lab: tuple[float, float, float], anchors: dict[str, tuple[float, float, float]]
) -> str | None:
    """The anchor of nearest hue to ``lab`` (both chromatic), or nearest in CIELAB among the
    grey anchors for a grey ``lab``; None when there is no anchor of its kind."""
    grey = math.hypot(lab[1], lab[2]) < GREY_CHROMA
    kind = {w: a for w, a in anchors.items() if (math.hypot(a[1], a[2]) < GREY_CHROMA) == grey}
    if not kind:
        return None
    if grey:
        return min(kind, key=lambda w: math.dist(lab, kind[w]))
    hue = math.atan2(lab[2], lab[1])
    return min(kind, key=lambda w: _angle(hue, math.atan2(kind[w][2], kind[w][1])))


def _angle(a: float, b: float) -> float:
    """The angle between two hues, radians in [0, pi]."""
    return abs((a - b + math.pi) % (2 * math.pi) - math.pi)


def read_colour_words(tokenizer: Any, name: str, known: Iterable[str]) -> None:
    """Make the ``transformers`` fast tokenizer read every colour word of lexicon ``name`` as
    the ``known`` word :func:`readings` gives: regex replacements after its own normaliser
    (which lower-cases), saved with it in ``tokenizer.json``."""
    from tokenizers import Regex, normalizers

    by_known: dict[str, list[str]] = {}
    for word, reading in readings(name, known).items():
        by_known.setdefault(reading, []).append(word)
    if not by_known:
        return
    backend = tokenizer.backend_tokenizer
    rules = [
        normalizers.Replace(Regex(rf"\b({'|'.join(sorted(words))})\b"), reading)
        for reading, words in sorted(by_known.items())
    ]
    own = [backend.normalizer] if backend.normalizer is not None else []
    backend.normalizer = normalizers.Sequence([*own, *rules])
