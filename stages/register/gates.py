"""Promotion to ``champion``: the gates a candidate must pass, and their registry tags.

Three gates (four for a random-weight policy), decided on the evaluate and latency stages'
records:

- ``held-out success``: success on the held-out suite >= ``min_success`` (always enforced):
  the lower end of its 95% Wilson interval, or the point estimate (``min_success_on``);
- ``no regression vs champion``: not worse than the current champion on the same seeds at
  ``evaluate.gate_confidence`` (enforced if ``no_regression``);
- ``latency``: the latency gate passed on the target (enforced if ``latency``);
- ``success at device latency``: played at the inference delay the target will have (its
  latency gate's p99, in the profile's mode), the candidate still reaches ``min_success`` and
  is not worse than itself at zero delay nor than the champion at that delay (enforced if
  ``at_latency``; absent where it was not measured);
- ``real weights``: only on a policy built with random weights (``policy.weights: random``,
  a systems test), where it always fails and is always enforced: such a version is never
  champion. ``robo-pipe models promote`` refuses it even with ``--force``
  (:func:`pipelines.registry.promotion.promote`, on its ``robo_pipe.random_weights`` tag).

A version becomes ``champion`` only if no enforced gate failed. Every gate's verdict, what was
measured and what was required are written on the version as tags (:func:`gate_tags`), which
:func:`gates_from_tags` reads back: ``robo-pipe models promote`` refuses a version that failed
one unless ``--force``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from robo_pipe.records import Record
from stages.register.config import PromotionConfig

GATE_TAG = "robo_pipe.gate."
"""Prefix of the gate tags on a model version: ``robo_pipe.gate.<name>`` = passed/failed, and
``.measured``, ``.required``, ``.enforced`` beside it."""

HELD_OUT = "held-out success"
NO_REGRESSION = "no regression vs champion"
LATENCY = "latency"
AT_LATENCY = "success at device latency"
REAL_WEIGHTS = "real weights"
"""The gate a random-weight policy fails (it exists only on those)."""


@dataclass(frozen=True)
class Gate(Record):
    """One gate's decision (its name is the key it is stored under)."""

    passed: bool
    enforced: bool
    """Whether a failure keeps the version from ``champion`` (``registry.promotion``)."""
    measured: str
    """What was measured, for people: e.g. ``"lower end 60.0% (estimate 65.0%, 95% CI 60.0% -
    80.0%)"``."""
    required: str
    """The threshold, for people: e.g. ``">= 70% (lower end of the 95% CI)"``."""


class Comparison(Protocol):
    """The candidate against the champion on the same seeds (``stages.evaluate`` report)."""

    passed: bool
    difference: float
    """Candidate minus champion success rate, 0..1."""
    p_value: float


class SuccessEstimate(Protocol):
    """A held-out success rate and its 95% Wilson interval (an ``EvalReport``)."""

    @property
    def success_rate(self) -> float:
        """0..1."""

    @property
    def ci95(self) -> tuple[float, float]:
        """(low, high), 0..1."""


class HeldOutResult(SuccessEstimate, Protocol):
    """What the gates read of the candidate's evaluation (an ``EvalReport``)."""

    @property
    def comparison(self) -> Comparison | None:
        """Against the champion on the same seeds; None when there was no champion."""


class LatencyResult(Protocol):
    """What the gates read of the latency gate's report (a ``LatencyReport``)."""

    passed: bool
    p99_ms: float
    misses: int
    target: str
    budget_ms: float
    allowed_misses: int


class AtLatencyResult(Protocol):
    """What the gates read of the evaluation at the target's delay (an ``AtDelay``)."""

    @property
    def ticks(self) -> int:
        """Ticks of delay played."""

    @property
    def why(self) -> str:
        """The delay's arithmetic, or why none was played."""

    @property
    def refused(self) -> str:
        """Why the runtime would refuse the delay ("" if it would not)."""

    @property
    def success_rate(self) -> float | None:
        """At the delay, 0..1 (None: not played)."""

    @property
    def ci95(self) -> tuple[float, float] | None:
        """Its 95% Wilson interval."""

    @property
    def vs_zero(self) -> Comparison | None:
        """Against itself at zero delay."""

    @property
    def vs_champion(self) -> Comparison | None:
        """Against the champion at the same delay."""

    @property
    def champion(self) -> str:
        """The champion compared with, or why none was."""

    @property
    def played(self) -> bool:
        """Whether episodes were played at a delay."""


def compared_success(result: SuccessEstimate, policy: PromotionConfig) -> float:
    """What ``policy.min_success`` is compared with (``policy.min_success_on``): the lower end
    of the 95% interval, or the point estimate."""
    return result.ci95[0] if policy.min_success_on == "lower_bound" else result.success_rate


def meets_min_success(result: SuccessEstimate, policy: PromotionConfig) -> bool:
    """Whether a held-out result reaches ``policy.min_success`` (inclusive) on what
    ``policy.min_success_on`` names: by default the lower end of its 95% interval, so a
    policy passes only when its episodes show it reaches the bar."""
    return compared_success(result, policy) >= policy.min_success


def held_out_text(result: SuccessEstimate, policy: PromotionConfig) -> tuple[str, str]:
    """The held-out gate's ``measured`` and ``required``, naming what is compared."""
    low, high = result.ci95
    interval = f"95% CI {low:.1%} - {high:.1%}"
    if policy.min_success_on == "lower_bound":
        measured = f"lower end {low:.1%} (estimate {result.success_rate:.1%}, {interval})"
        return measured, f">= {policy.min_success:.0%} (lower end of the 95% CI)"
    measured = f"estimate {result.success_rate:.1%} ({interval})"
    return measured, f">= {policy.min_success:.0%} (point estimate)"


def promotion_gates(
    policy: PromotionConfig,
    candidate: HeldOutResult,
    champion_version: str | None,
    latency: LatencyResult,
    gate_confidence: float,
    random_weights: bool = False,
    at_latency: AtLatencyResult | None = None,
) -> dict[str, Gate]:
    """Every gate's decision, in order (see the module docstring). ``champion_version``: the
    champion when the candidate was evaluated (None: there was none); without a comparison
    the candidate is that champion's own export. ``random_weights``: the policy was built with
    random weights (a systems test): the ``real weights`` gate is added, failed and enforced,
    whatever ``policy`` says (no setting lets such a version become champion).
    ``at_latency``: the candidate at its target's delay (None: not measured, no such gate)."""
    comparison = candidate.comparison
    if comparison is not None:
        vs = f"{comparison.difference:+.1%} vs v{champion_version}, p = {comparison.p_value:.3f}"
    elif champion_version:
        vs = f"is champion v{champion_version} (same export)"
    else:
        vs = "no champion yet"
    measured, required = held_out_text(candidate, policy)
    gates = {
        HELD_OUT: Gate(
            passed=meets_min_success(candidate, policy),
            enforced=True,
            measured=measured,
            required=required,
        ),
        NO_REGRESSION: Gate(
            passed=comparison is None or bool(comparison.passed),
            enforced=policy.no_regression,
            measured=vs,
            required=f"not worse at {gate_confidence:.0%} confidence",
        ),
        LATENCY: Gate(
            passed=bool(latency.passed),
            enforced=policy.latency,
            measured=f"p99 {latency.p99_ms:.2f} ms, {latency.misses} misses on {latency.target}",
            required=f"p99 <= {latency.budget_ms:g} ms, misses <= {latency.allowed_misses}",
        ),
    }
    if at_latency is not None:
        gates[AT_LATENCY] = at_latency_gate(at_latency, policy, gate_confidence)
    if random_weights:
        gates[REAL_WEIGHTS] = Gate(
            passed=False,
            enforced=True,
            measured="random weights (policy.weights: random): a systems test",
            required="pretrained or trained weights (policy.backbone); never champion otherwise",
        )
    return gates


def at_latency_gate(at: AtLatencyResult, policy: PromotionConfig, gate_confidence: float) -> Gate:
    """The ``success at device latency`` gate (see the module docstring)."""
    bar = f">= {policy.min_success:.0%}" + (
        " (lower end of the 95% CI)" if policy.min_success_on == "lower_bound" else ""
    )
    required = (
        f"{bar} at the delay; not worse than at zero delay nor than the champion there "
        f"({gate_confidence:.0%} confidence)"
    )
    enforced = policy.at_latency
    if at.refused:
        return Gate(False, enforced, f"{at.why}: {at.refused}", required)
    if not at.played or at.success_rate is None or at.ci95 is None:
        return Gate(True, enforced, at.why, required)
    low, high = at.ci95
    parts = [f"{at.success_rate:.1%} (95% CI {low:.1%} - {high:.1%}) at {at.why}"]
    passed = meets_min_success(at, policy)  # type: ignore[arg-type]
    for c, against in ((at.vs_zero, "zero delay"), (at.vs_champion, f"{at.champion} there")):
        if c is not None:
            parts.append(f"{c.difference:+.1%} vs {against} (p = {c.p_value:.3f})")
            passed = passed and bool(c.passed)
    if at.vs_champion is None and at.champion:
        parts.append(f"champion {at.champion}")
    return Gate(passed, enforced, "; ".join(parts), required)


def blocking_gates(gates: Mapping[str, Gate]) -> list[str]:
    """The gates that keep a version from ``champion``: enforced and failed, in order."""
    return [name for name, g in gates.items() if g.enforced and not g.passed]


def gate_tags(gates: Mapping[str, Gate]) -> dict[str, str]:
    """Registry tags recording every gate (see :data:`GATE_TAG`)."""
    tags = {}
    for name, g in gates.items():
        tags[GATE_TAG + name] = "passed" if g.passed else "failed"
        tags[f"{GATE_TAG}{name}.measured"] = g.measured
        tags[f"{GATE_TAG}{name}.required"] = g.required
        tags[f"{GATE_TAG}{name}.enforced"] = "true" if g.enforced else "false"
    return tags


def gates_from_tags(tags: Mapping[str, str]) -> dict[str, Gate]:
    """The gates :func:`gate_tags` wrote, read back from a version's tags (sorted by name).
    Versions tagged before ``.enforced`` was recorded read as enforced."""
    names = sorted(k[len(GATE_TAG) :] for k in tags if k.startswith(GATE_TAG) and _is_verdict(k))
    return {
        name: Gate(
            passed=tags[GATE_TAG + name] == "passed",
            enforced=tags.get(f"{GATE_TAG}{name}.enforced", "true") == "true",
            measured=tags.get(f"{GATE_TAG}{name}.measured", ""),
            required=tags.get(f"{GATE_TAG}{name}.required", ""),
        )
        for name in names
    }


def failed_gates(tags: Mapping[str, str]) -> list[str]:
    """Names of the gates a version failed when it was registered (enforced or not), sorted."""
    return [name for name, g in gates_from_tags(tags).items() if not g.passed]


def may_promote(tags: Mapping[str, str], force: bool) -> tuple[bool, list[str]]:
    """Whether a version with these tags may be made champion by hand, and the gates it failed:
    not if it failed any, unless ``force`` (the override is then recorded with its reason)."""
    failed = failed_gates(tags)
    return (force or not failed), failed


# -- the champion history ------------------------------------------------------------------------


def history_after_promotion(history: list[str], version: str) -> list[str]:
    """The champion history (versions, oldest first) once ``version`` is champion: it moves to
    the end (a version promoted again is not listed twice)."""
    return [v for v in history if v != version] + [version]


def rollback_target(history: list[str], current: str) -> tuple[str, list[str]] | None:
    """The version ``champion`` goes back to when ``current`` is rolled back, and the history
    after it; None if there was no other champion."""
    earlier = [v for v in history if v != current]
    return (earlier[-1], earlier) if earlier else None


def _is_verdict(key: str) -> bool:
    return not key.endswith((".measured", ".required", ".enforced"))
