"""Why evaluated episodes failed, counted by their task family's failure modes.

Each task family names its own modes and classifies an episode from the values it asked the
simulator to record (:attr:`sim_scenes.tasks.TaskFamily.failure_modes`, ``failure_mode``): the
touch family tells a wrong object (grounding) from a near miss (execution) and a timeout.
This module only counts them and writes them out, whatever the family.
"""

from __future__ import annotations

import statistics

from sim_scenes.tasks import FailureMode


def breakdown(
    modes: tuple[FailureMode, ...], failures: list[str], signals: list[dict[str, float]]
) -> dict[str, float]:
    """Counts of each of ``modes`` among ``failures`` (one per episode, ``""`` = success),
    and, for a mode with a ``measure`` and episodes, the median and the largest of that
    measure over them in its unit: ``<mode>_median_<unit>``, ``<mode>_max_<unit>``
    (``near_miss_median_cm``). ``signals``: each episode's recorded values."""
    counts: dict[str, float] = {m.name: float(failures.count(m.name)) for m in modes}
    for mode in modes:
        values = sorted(
            s[mode.measure] * mode.scale
            for f, s in zip(failures, signals, strict=True)
            if mode.measure and f == mode.name and mode.measure in s
        )
        if values:
            counts[_key(mode, "median")] = statistics.median(values)
            counts[_key(mode, "max")] = values[-1]
    return counts


def _key(mode: FailureMode, statistic: str) -> str:
    """Where :func:`breakdown` keeps ``statistic`` (median, max) of ``mode``'s measure."""
    return f"{mode.name}_{statistic}_{mode.unit}"


def _measure(mode: FailureMode, counts: dict[str, float]) -> tuple[float, float | None] | None:
    """``mode``'s measure in ``counts``: (median, max or None); None without one."""
    median = counts.get(_key(mode, "median"))
    if not mode.measure or median is None:
        return None
    return median, counts.get(_key(mode, "max"))


def measured(mode: FailureMode, counts: dict[str, float]) -> str:
    """``mode``'s measure in ``counts`` as ``4.8 cm (7.2 cm)`` (median, max); ``–`` when it has
    no measure or no episodes."""
    found = _measure(mode, counts)
    if found is None:
        return "–"
    median, most = found
    return f"{median:.1f} {mode.unit}" + ("" if most is None else f" ({most:.1f} {mode.unit})")


def breakdown_line(modes: tuple[FailureMode, ...], counts: dict[str, float]) -> str:
    """A :func:`breakdown` in one line: ``wrong object 3, near miss 12 (closest: median 4.8 cm,
    max 7.2 cm), timeout 1``."""
    parts = []
    for mode in modes:
        part = f"{mode.label} {int(counts.get(mode.name, 0))}"
        found = _measure(mode, counts)
        if found is not None:
            median, most = found
            part += f" ({mode.measure_label}: median {median:.1f} {mode.unit}"
            part += "" if most is None else f", max {most:.1f} {mode.unit}"
            part += ")"
        parts.append(part)
    return ", ".join(parts)
