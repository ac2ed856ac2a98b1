"""The latency step: the export in the control loop of the simulated robot on the target
profile's engine, p99 against the budget (the latency gate)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.progress import SILENT, Listener

if TYPE_CHECKING:
    from deploy_edge.latency_report import LatencyReport


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
