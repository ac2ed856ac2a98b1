"""The latency step: the export in the control loop of the simulated robot on the target
profile's engine, p99 against the budget (the latency gate); the candidate played in
simulation at the delay that p99 means on the target (the success at device latency gate); and
the delay sweep, the policy's success in simulation as its inference delay grows, that p99's
delay marked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.progress import SILENT, Listener

if TYPE_CHECKING:
    from deploy_edge.latency_report import LatencyReport
    from pipelines.records import Evaluation
    from stages.evaluate import ShardOutcome
    from stages.evaluate.at_delay import AtDelay
    from stages.evaluate.sweep import DelaySweep


def measure_latency(
    cfg: PipelineConfig, export: Path, out: Path, listener: Listener = SILENT
) -> LatencyReport:
    """The latency gate (``cfg.latency``): the export in the control loop of ``cfg``'s
    simulated robot on the target profile's engine, p99 against the budget. Reports into
    ``out``. A profile with ``precision: auto`` gates every way its engine can run the bundle
    (the FP32 model and each candidate variant) and reports the choice the device would make
    (:func:`deploy_edge.latency.run_auto_gate`): the most accurate one within the budget."""
    from deploy_edge.bundle.io_spec import read_io_spec
    from deploy_edge.latency import run_auto_gate, run_gate
    from deploy_edge.targets import load_target
    from robots.spec import get_robot
    from sim_scenes.sim_robot import SimulatedRobot

    gate = cfg.latency
    profile = load_target(gate.target)
    spec = read_io_spec(export)

    def robot() -> SimulatedRobot:
        return SimulatedRobot(
            get_robot(cfg.robot),
            cfg.scene.task(),
            seed=cfg.seed,
            cameras=tuple(spec.cameras),
            image_size=spec.image_size,
            # the config's simulator, on one thread (one environment has nothing to share out)
            sim=cfg.sim.model_copy(update={"num_threads": 1}),
        )

    first = robot()
    first.connect()  # the gate runs the control loop on its first episode's instruction
    instruction = first.instruction
    first.stop()
    listener.started("latency", None, "")
    listener.advanced("latency", 0, f"measuring {gate.steps} control steps on {profile.name}")
    out.mkdir(parents=True, exist_ok=True)
    if profile.chooser is not None:
        return run_auto_gate(
            export,
            robot,
            instruction,
            profile,
            gate.steps,
            gate.warmup,
            gate.budget_ms,
            gate.pace,
            out,
        )
    return run_gate(
        export, first, instruction, profile, gate.steps, gate.warmup, gate.budget_ms, gate.pace, out
    )


def sweep_delays(
    cfg: PipelineConfig,
    policy: Path,
    out: Path,
    inference_p99_ms: float | None,
    listener: Listener = SILENT,
    ray_address: str | None = None,
    *,
    name: str = "",
    stage: str = "delay sweep",
) -> DelaySweep:
    """``policy`` on ``cfg``'s evaluation suite at each delay of the sweep, sync and async, on
    the same seeds (:func:`stages.evaluate.sweep.delay_sweep`), the delay of an inference of
    ``inference_p99_ms`` (plus the target profile's ``inference_margin_ms``) played and
    marked; ``delay_sweep.md``/``.png``/``.json`` into ``out``; ``name``: the policy as the user
    named it; ``stage``: the progress row it reports on."""
    from deploy_edge.targets import load_target
    from stages.evaluate.sweep import delay_sweep, write_sweep

    listener.started(stage, None, "episodes")

    def on_plan(episodes: int) -> None:
        listener.started(stage, episodes, "episodes of the delay sweep")

    sweep = delay_sweep(
        policy,
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.evaluate,
        cfg.seed,
        expected_ms=inference_p99_ms,
        margin_ms=load_target(cfg.latency.target).inference_margin_ms,
        ray_address=ray_address,
        on_shard=counting(listener, stage),
        on_plan=on_plan,
        name=name,
    )
    write_sweep(sweep, out)
    return sweep


def play_at_device_delay(
    cfg: PipelineConfig,
    export: Path,
    latency: LatencyReport,
    evaluation: Evaluation,
    out: Path,
    listener: Listener = SILENT,
    ray_address: str | None = None,
    against: str | None = None,
) -> AtDelay:
    """The candidate ``export`` on the held-out suite at the inference delay its target will
    have (``latency``'s p99 in the profile's mode, :mod:`stages.evaluate.at_delay`), paired
    with its own zero-delay outcomes (``evaluation``'s) and with the champion it was evaluated
    against (``against``: this champion version instead, the champion there is now), at the
    same delay; ``at_device_delay.json`` into ``out``, beside the latency report, where the
    register step's gates read it."""
    from deploy_edge.targets import load_target
    from pipelines.registry.champion import candidate_outcomes
    from pipelines.registry.exports import fetch_export
    from stages.evaluate.at_delay import at_device_delay, write_at_delay
    from stages.evaluate.sequential import decode_outcomes

    candidate, version = evaluation.candidate, against or evaluation.champion_version
    # No comparison: the candidate is the champion's own export, nothing to hold it against.
    champion = None
    if version is not None and (against is not None or candidate.comparison is not None):
        champion = (version, fetch_export(cfg.model_name, version)[1])
    listener.started("latency", None, "episodes at the device's delay")
    on_shard = counting(listener, "latency", "episodes at the device's delay")

    promotion = cfg.registry.promotion
    result = at_device_delay(
        export, cfg.robot, cfg.scene, cfg.sim, cfg.evaluate, cfg.seed, out / "at-delay",
        target=load_target(cfg.latency.target), inference_ms=latency.inference_ms,
        zero_delay=decode_outcomes(candidate_outcomes(candidate)), champion=champion,
        margin=promotion.margin, min_success=promotion.min_success,
        ray_address=ray_address, on_shard=on_shard,
    )  # fmt: skip
    write_at_delay(result, out)
    return result


def replay_at_device_delay(
    cfg: PipelineConfig,
    export: Path,
    latency: LatencyReport,
    evaluation: Evaluation,
    version: str,
    listener: Listener = SILENT,
) -> None:
    """The candidate at its device's delay played again, against champion ``version``: the
    champion moved after the latency step held the candidate to the one it was evaluated
    against (:func:`pipelines.registry.champion.recheck`). The result replaces
    ``at_device_delay.json`` beside ``latency``'s report, where the gates read it; nothing
    when no delay was played there."""
    from stages.evaluate.at_delay import read_at_delay

    out = Path(latency.report).parent if latency.report else None
    played = read_at_delay(out) if out is not None else None
    if out is None or played is None or not played.played:
        return
    play_at_device_delay(cfg, export, latency, evaluation, out, listener, against=version)


def counting(listener: Listener, stage: str, detail: str = "") -> Callable[[ShardOutcome], None]:
    """An ``on_shard`` that reports the episodes played so far on ``stage``'s progress row."""
    played = [0]

    def on_shard(outcome: ShardOutcome) -> None:
        played[0] += len(outcome.episodes)
        listener.advanced(stage, played[0], detail)

    return on_shard
