"""Why an evaluated episode failed: the wrong object, a near miss, or a timeout.

Every episode of the touch task ends solved or cut at its step limit, so each failure is a
timeout in the strict sense; what tells a team what to fix is *where the arm was*, from the
closest approaches the simulator reports (tool centre point to object centres, m)::

    wrong_object  it came closer to another object than it ever came to the named one, and
                  within touching distance of it (radius + NEAR_MISS_MARGIN): grounding
    near_miss     it came within radius + NEAR_MISS_MARGIN of the named object but never held
                  inside the radius: execution (precision, overshoot, not pressing on)
    timeout       neither: still away from every object when time ran out (hesitation, a
                  wrong direction, a pose it never recovered from)

Execution failures are what RL in simulation fixes quickly; grounding failures it fixes
slowly, so the breakdown says where RL can help.
"""

from __future__ import annotations

NEAR_MISS_MARGIN = 0.03
"""m beyond the success radius that still counts as reaching the object (the objects are 5 cm
across: the tool centre point resting on one is about 3 cm from its centre)."""
FAILURE_MODES = ("wrong_object", "near_miss", "timeout")


def failure_mode(
    success: bool, closest_target: float, closest_distractor: float, radius: float
) -> str:
    """The failure mode of an episode (:data:`FAILURE_MODES`), ``""`` for a success.

    ``closest_target`` / ``closest_distractor``: the episode's closest approach to the named
    object / any other object, m (``inf``: no other object; ``nan``: not reported, so the
    episode cannot be a wrong-object failure). ``radius``: the success radius, m.
    """
    if success:
        return ""
    reach = radius + NEAR_MISS_MARGIN
    if closest_distractor < closest_target and closest_distractor <= reach:
        return "wrong_object"
    if closest_target <= reach:
        return "near_miss"
    return "timeout"


def breakdown(modes: list[str], closest: list[float]) -> dict[str, float]:
    """Counts of each failure mode among ``modes`` (one per episode, ``""`` = success), and,
    when there are near misses, the median and the largest of their closest approaches to the
    named object (``closest``, m) in cm: ``near_miss_median_cm``, ``near_miss_max_cm``."""
    counts: dict[str, float] = {m: float(modes.count(m)) for m in FAILURE_MODES}
    near = sorted(c for m, c in zip(modes, closest, strict=True) if m == "near_miss")
    if near:
        middle = len(near) // 2
        counts["near_miss_median_cm"] = 100 * (near[middle] + near[~middle]) / 2
        counts["near_miss_max_cm"] = 100 * near[-1]
    return counts


def breakdown_line(counts: dict[str, float]) -> str:
    """A :func:`breakdown` in one line: ``wrong object 3, near miss 12 (closest: median 4.8 cm,
    max 7.2 cm), timeout 1``."""
    near = f"near miss {int(counts.get('near_miss', 0))}"
    if "near_miss_median_cm" in counts:
        near += f" (closest: median {counts['near_miss_median_cm']:.1f} cm"
        if "near_miss_max_cm" in counts:
            near += f", max {counts['near_miss_max_cm']:.1f} cm"
        near += ")"
    return (
        f"wrong object {int(counts.get('wrong_object', 0))}, {near}, "
        f"timeout {int(counts.get('timeout', 0))}"
    )
