"""Sampling every feature "as of" a frame's time: the one rule behind a bag's frames.

A frame at time ``t`` takes, of each feature, the newest message stamped at or before ``t`` and
no older than ``max_age``; a frame for which any feature has none is dropped, and the report
says which feature dropped it. Never a message from after ``t``: a policy trained on it would
learn from the future.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AsOf:
    """Each frame's message of one feature: ``index[k]`` into the feature's messages, valid
    where ``ok[k]``."""

    index: np.ndarray
    """int64 ``(frames,)``; -1 where there is none."""
    ok: np.ndarray
    """bool ``(frames,)``: a message at or before the frame and no older than the age limit."""


def as_of(frame_ns: np.ndarray, message_ns: np.ndarray, max_age_ns: int | None) -> AsOf:
    """For each frame time (int64 ns), the newest message time at or before it (``message_ns``
    sorted ascending); ``max_age_ns`` None: any age."""
    index = np.searchsorted(message_ns, frame_ns, side="right") - 1
    ok = index >= 0
    if max_age_ns is not None:
        age = frame_ns - message_ns[np.maximum(index, 0)]
        ok &= age <= max_age_ns
    return AsOf(np.where(ok, index, -1), ok)


def runs(keep: np.ndarray, starts: np.ndarray) -> list[tuple[int, int]]:
    """``[begin, end)`` of each maximal run of kept frames that no episode start (``starts``:
    bool, a frame that begins an episode) interrupts."""
    spans: list[tuple[int, int]] = []
    begin = None
    for k in range(len(keep)):
        if begin is not None and (not keep[k] or starts[k]):
            spans.append((begin, k))
            begin = None
        if keep[k] and begin is None:
            begin = k
    if begin is not None:
        spans.append((begin, len(keep)))
    return spans
