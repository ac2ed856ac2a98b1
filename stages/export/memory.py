"""The export's memory discipline: one large thing in memory at a time.

At the SmolVLM-256M preset the export peaked at 8.3 GiB, 9.6 times its FP32 weights: the torch
policy (twice: the LoRA-merged copy), ONNX Runtime sessions with their prepacked weights, and
the quantizer's calibration all at once. Now torch's side of every check is computed first and
the torch model freed before any session is opened (:mod:`stages.export.onnx`); the checks run
one session at a time, without prepacking (:func:`check_session`); the freed heap is handed back
between phases (:func:`release_memory`); and the calibration runs from disk in priority order
(:func:`stages.export.quantize.calibrate`). What is left is the tracer's own peak.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import resource
import sys
from pathlib import Path
from typing import Any


def check_session(path: Path) -> Any:
    """An ONNX Runtime session of the graph at ``path`` for the export's checks (parity,
    scoring): run a few times, so without weight prepacking (a second, reordered copy of every
    weight matrix that pays only over many runs)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def release_memory(collect: bool = False) -> None:
    """Hand the freed heap back to the system (glibc keeps freed arenas otherwise, and the
    next phase's peak would stack on this one's); first, with ``collect``, collect what was
    just dropped that only the cycle collector frees. A collection costs 0.2-0.5 s in a
    process with torch loaded, so the export asks for it once, where it drops a model worth
    it (:data:`COLLECT_FROM`); sessions are freed when their last reference goes."""
    if collect:
        gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):  # not glibc (musl): nothing to trim
            ctypes.CDLL("libc.so.6").malloc_trim(0)


COLLECT_FROM = 10_000_000
"""Parameters from which the export collects after dropping the torch model (a tiny policy
frees less than the collection costs in time)."""


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (``ru_maxrss``: KiB on Linux, bytes
    on macOS). A process that held more before the export reports that: the figure bounds
    the export's peak from above."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)
