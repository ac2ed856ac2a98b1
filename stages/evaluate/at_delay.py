"""Success at the device's latency (issue 52): the candidate played in simulation at the
inference delay its target will have, against itself at zero delay and against the champion at
the same delay, on the held-out seeds.

The delay is the target's measured inference (the latency gate's p99, :attr:`~deploy_edge.
latency_report.LatencyReport.inference_ms`) in the profile's mode, as
:mod:`stages.evaluate.delay` plays it:

    async  inference p99 + the profile's ``inference_margin_ms``, in control ticks (at least
           one: a chunk computed on tick t's observation arrives for tick t + d), the
           runtime's queue, anchoring and blend
    sync   no delay while the tick's p99 fits in its period (the robot acts in the tick it
           observes: the held-out evaluation already played that); past it, the robot holds
           for the ticks the engine takes, then executes the profile's ``execute`` actions

Two paired sequential tests decide, as the evaluate stage's do (:func:`stages.evaluate.run.
evaluate`): the candidate at the delay against its own zero-delay outcomes (stored: only the
delayed episodes are played) and against the champion playing the same delay. A delay the
runtime would refuse (an async chunk too short for it) is recorded as refused, not played.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from deploy_edge.targets import TargetProfile
from robo_pipe.records import Record
from robots.spec import get_robot
from sim_scenes.config import SceneConfig, SimConfig
from stages.evaluate.comparison import Comparison
from stages.evaluate.config import DelayConfig, EvalConfig
from stages.evaluate.delay import DelayError, delay_plan
from stages.evaluate.run import Outcomes, evaluate
from stages.evaluate.shards import ShardOutcome


@dataclass
class AtDelay(Record):
    """The candidate's success at its target's inference delay (``at_device_delay.json``)."""

    target: str
    mode: str
    """The profile's loop: ``sync`` or ``async``."""
    inference_ms: float
    """The latency gate's inference p99 on the target (async: inference alone; sync: the tick)."""
    margin_ms: float
    """Added before counting ticks (async: the profile's ``inference_margin_ms``; sync: 0)."""
    period_ms: float
    ticks: int
    """Ticks of delay played; 0: none (a sync tick within its period): nothing played."""
    why: str
    """One line for people: the arithmetic of the delay, or why none was played."""
    episodes: int = 0
    successes: int = 0
    success_rate: float | None = None
    ci95: tuple[float, float] | None = None
    """Wilson 95% interval of ``success_rate``."""
    vs_zero: Comparison | None = None
    """Against the candidate's own outcomes at zero delay, on the same seeds."""
    vs_champion: Comparison | None = None
    """Against the champion playing the same delay (None: no champion, or the same export)."""
    champion: str = ""
    """The champion compared with (``v3``), or why none was ("" when there is no champion)."""
    refused: str = ""
    """The runtime would refuse this delay (an async chunk too short for it); nothing played."""
    report: str = ""
    """The delayed evaluation's ``report.md`` ("" when nothing was played)."""

    @property
    def played(self) -> bool:
        """Whether episodes were played at a delay."""
        return self.ticks > 0 and not self.refused


def device_delay(
    target: TargetProfile, inference_ms: float, period_ms: float, base: DelayConfig
) -> DelayConfig | None:
    """The delay ``target`` will have with inferences of ``inference_ms`` (p99) at a control
    period of ``period_ms`` (see the module docstring); None: none (a sync tick within its
    period). ``base``: the evaluate config's delay settings, whose mode, inference, margin,
    blend and execute the profile replaces."""
    if target.delay_ticks(inference_ms, period_ms) == 0:
        return None
    if target.mode == "sync":
        return base.model_copy(
            update={
                "mode": "sync",
                "inference_ms": inference_ms,
                "margin_ms": target.delay_margin_ms,
                "latency_report": None,
                "execute": target.execute,
            }
        )
    return base.model_copy(
        update={
            "mode": "async",
            "inference_ms": inference_ms,
            "latency_report": None,
            "margin_ms": target.delay_margin_ms,
            "blend": target.blend,
        }
    )


def at_device_delay(
    export: Path,
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    config: EvalConfig,
    seed: int,
    out: Path,
    *,
    target: TargetProfile,
    inference_ms: float,
    zero_delay: Outcomes,
    champion: tuple[str, Path] | None = None,
    margin: float = 0.0,
    min_success: float | None = None,
    ray_address: str | None = None,
    on_shard: Callable[[ShardOutcome], None] | None = None,
) -> AtDelay:
    """``export`` on ``config``'s held-out suite at the delay ``target`` will have with
    inferences of ``inference_ms`` (p99), paired with ``zero_delay`` (its own outcomes there at
    zero delay) and with ``champion`` (its version and export) at the same delay; reports into
    ``out`` (``vs-zero/``, ``vs-v<version>/``). ``margin`` and ``min_success``: the promotion's,
    as the evaluate stage's comparison uses them."""
    spec = get_robot(robot)
    period_ms = 1000.0 / spec.control_hz
    delay = device_delay(target, inference_ms, period_ms, config.delay)
    margin_ms = 0.0 if delay is None else delay.margin_ms
    result = AtDelay(
        target=target.name,
        mode=target.mode,
        inference_ms=inference_ms,
        margin_ms=margin_ms,
        period_ms=period_ms,
        ticks=0,
        why=f"none: sync, the tick's p99 {inference_ms:.1f} ms within its {period_ms:g} ms period",
    )
    if delay is None:
        return result
    plan = delay_plan(delay, spec)
    result.ticks = plan.ticks if plan is not None else 0
    plus = f" + margin {margin_ms:g} ms" if margin_ms else ""
    result.why = (
        f"{target.mode}, inference p99 {inference_ms:.1f} ms{plus} = {result.ticks} "
        f"tick{'s' if result.ticks != 1 else ''} of {period_ms:g} ms"
    )
    delayed = config.model_copy(update={"delay": delay})
    play = partial(
        evaluate, export, robot, scene, sim, delayed, seed,
        ray_address=ray_address, on_shard=on_shard, margin=margin,
    )  # fmt: skip
    try:
        own = play(out / "vs-zero", baseline_outcomes=zero_delay, min_success=min_success)
    except DelayError as err:  # the runtime's own rule: it would refuse this delay too
        result.refused = str(err)
        return result
    assert own.delay is not None and own.comparison is not None  # a delay, paired with itself
    result.episodes, result.successes = own.episodes, own.successes
    result.success_rate, result.ci95 = own.success_rate, own.ci95
    result.vs_zero, result.report = own.comparison, str(out / "vs-zero" / "report.md")
    if champion is not None:
        version, path = champion
        try:
            theirs = play(out / f"vs-v{version}", baseline=path)
            result.vs_champion, result.champion = theirs.comparison, f"v{version}"
        except DelayError as err:  # its chunk cannot cover the delay: nothing to hold against
            result.champion = f"v{version} cannot play this delay ({err})"
    return result


AT_DELAY_FILE = "at_device_delay.json"
"""Written beside the latency gate's report (:func:`write_at_delay`)."""


def write_at_delay(result: AtDelay, folder: Path) -> Path:
    """``result`` as ``folder/at_device_delay.json``."""
    path = folder / AT_DELAY_FILE
    path.write_text(json.dumps(result.to_json(), indent=2))
    return path


def read_at_delay(folder: Path) -> AtDelay | None:
    """The :class:`AtDelay` written into ``folder``; None when there is none."""
    path = folder / AT_DELAY_FILE
    return AtDelay.from_json(json.loads(path.read_text())) if path.is_file() else None
