"""The pipeline's own records (the stages' are theirs: ``DatasetRef``, ``CheckpointRef``,
``ExportRef``, ``EvalReport``, ``LatencyReport``). Every one is a typed :class:`Record` with a
JSON round trip: resume files, ``--json`` output and ``result.json`` hold these shapes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from robo_pipe.records import Record
from stages.evaluate.comparison import Comparison
from stages.evaluate.report import EvalReport
from stages.register import Gate

if TYPE_CHECKING:  # the checkpoint module imports torch
    from deploy_edge.latency_report import LatencyReport
    from stages.dataset.layout import DatasetRef
    from stages.export import ExportRef
    from stages.policy.checkpoint import CheckpointRef


@dataclass(frozen=True)
class Evaluation(Record):
    """The pipeline's evaluate stage: the candidate export on the held-out suite (against the
    champion on the same seeds, when there is one) and the model fine-tuning started from."""

    candidate: EvalReport
    champion_version: str | None
    """The champion when the candidate was evaluated (None: no champion yet)."""
    start: EvalReport | None = None
    """The base fine-tuning started from, on the same suite (None for a hub-vlm policy)."""
    warm_start: EvalReport | None = None
    """RL fine-tuning only: the BC fine-tune RL started from, on the same suite and seeds."""
    rl_gain: Comparison | None = None
    """RL fine-tuning only: the paired test of RL's gain on those seeds, as the promotion test
    is run with the roles swapped: the BC warm start is the ``candidate`` and the RL result its
    ``baseline``, so ``decision == "worse"`` means the gain is significant (one-sided exact
    McNemar ``p_value``; ``difference`` is BC minus RL)."""


@dataclass(frozen=True)
class Registration(Record):
    """The register stage: the model version, its aliases and every gate's decision."""

    name: str
    version: str
    aliases: list[str]
    promoted: bool
    """Whether this version is ``champion`` (every enforced gate passed)."""
    blocked_by: list[str]
    """The enforced gates it failed, in order."""
    gates: dict[str, Gate]
    source: str
    """The MLflow artifact URI of the registered bundle."""


@dataclass(frozen=True)
class EdgeDeployment(Record):
    """The deploy stage: the new champion on an edge device, and one episode run on it."""

    device: str
    model_version: str
    state: str
    """The agent's verdict: ``active`` when the device runs it (else refused, rolled_back)."""
    reason: str
    p99_ms: float | None
    """The on-device latency gate's p99 (None if the gate did not run)."""
    episode_success: bool | None
    """Whether the episode run on the device succeeded (None: no episode ran)."""
    episode_ticks: int
    episode_p99_ms: float | None
    state_dir: str
    """The agent's state (slots, journal, history)."""


@dataclass(frozen=True)
class StageRun(Record):
    """How a stage went in one pipeline run."""

    seconds: float
    reused: bool
    """The record came from an earlier run with the same inputs."""


@dataclass(frozen=True)
class PipelineResult(Record):
    """What ``train_simulate_deploy`` returns (and writes as ``result.json``)."""

    config_name: str
    config_hash: str
    run_dir: str
    model_name: str
    version: str
    aliases: list[str]
    promoted: bool
    blocked_by: list[str]
    gates: dict[str, Gate]
    dataset: str
    checkpoint: str
    export: str
    success_rate: float
    """Held-out success of the export, 0..1."""
    ci95: tuple[float, float]
    start_success_rate: float | None
    """The same for the model fine-tuning started from."""
    latency_p99_ms: float
    mlflow_run_id: str
    stages: dict[str, StageRun] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    """Prefect flow run, MLflow run and model version pages."""
    device: EdgeDeployment | None = None
    """Where the new champion was deployed (``deploy.local_agent``), if it was."""
    rollout: FleetResult | None = None
    """Its rollout to ``deploy.fleet``, if the config names one."""
    warm_start_success_rate: float | None = None
    """RL after BC only: the BC warm start's held-out success (the same seeds)."""
    warm_start_ci95: tuple[float, float] | None = None
    """RL after BC only: its 95% interval."""
    rl_gain: Comparison | None = None
    """RL after BC only: the paired test of RL's gain over it (:attr:`Evaluation.rl_gain`)."""
    comparison: Comparison | None = None
    """Against the champion on the same seeds (the no-regression gate's evidence): the paired
    table, the test, its p-value against the boundary, where a sequential comparison stopped;
    None without a champion."""

    @property
    def verdict(self) -> str:
        """The run's outcome in one word, the first that applies: ``blocked`` (a gate kept the
        candidate from champion), ``refused`` (the device refused or rolled it back),
        ``rollout-stopped`` (a fleet wave failed), else ``promoted``. Only ``promoted`` exits 0
        (docs/exit-codes.md)."""
        if not self.promoted:
            return "blocked"
        if self.device is not None and self.device.state != "active":
            return "refused"
        if self.rollout is not None and not self.rollout.dry_run and not self.rollout.complete:
            return "rollout-stopped"
        return "promoted"


@dataclass(frozen=True)
class ChampionCheck(Record):
    """What ``champion_regression`` (``robo-pipe models check``) found."""

    model_name: str
    version: str
    evaluation: EvalReport
    """The champion on the held-out suite (without per-episode lists)."""
    min_success: float
    passed: bool
    """Held-out success still reaches ``registry.promotion.min_success``."""
    measured: str = ""
    """What was compared with the bar, for people (as the held-out gate says it)."""
    required: str = ""
    """The bar and what it is compared with, e.g. ``>= 70% (lower end of the 95% CI)``."""


@dataclass
class DeviceRollout(Record):
    """One device of a rollout: what it ran before, what it runs now, and why."""

    device: str
    wave: int
    """0-based; with a canary, wave 0 is the canary."""
    before: str | None
    """``model:version`` the device ran before (None: nothing, or unknown when unreachable)."""
    after: str | None
    """``model:version`` it runs now."""
    state: str
    """``active`` (runs the new version), ``staged`` (waits for the robot-busy lock),
    ``refused`` / ``rolled_back`` / ``interrupted`` (the agent's verdict; it runs ``before``),
    ``unreachable``, ``failed`` (the request failed or timed out), ``reverted`` (it ran the new
    version and the stopped rollout rolled it back), ``skipped`` (its wave never started),
    ``planned`` (a dry run); in a rollout record only, ``deploying`` (its deployment had
    started when the record was written)."""
    reason: str = ""
    p99_ms: float | None = None
    """On-device p99 of the latency gate."""
    sent_bytes: int | None = None
    """Bytes its upload sent (the pieces it lacked; None: nothing was uploaded)."""
    seconds: float = 0.0
    deployment_id: str = ""
    """The agent's record of the deployment (its history)."""
    at: str = ""
    """UTC time the device's deployment (or its rollback) ended."""


@dataclass
class FleetResult(Record):
    """A fleet rollout (or its plan)."""

    model_name: str
    model_version: str
    fleet: str
    waves: list[list[str]]
    devices: list[DeviceRollout]
    canary: int = 0
    """Devices of the canary wave (wave 0); 0: no canary."""
    stopped_at_wave: int | None = None
    """The wave whose failures stopped the rollout (None: it went through)."""
    reason: str = ""
    dry_run: bool = False
    flow_run_id: str = ""
    seconds: float = 0.0
    at: str = ""
    rollout_id: str = ""
    """Its record under ``$ROBO_PIPE_HOME/rollouts`` (:mod:`pipelines.deploy.rollouts`)."""
    cancelled_by: str = ""
    """``SIGINT`` / ``SIGTERM`` when a signal cancelled it ("": it was not cancelled)."""

    @property
    def label(self) -> str:
        """``model:version`` of the release."""
        return f"{self.model_name}:{self.model_version}"

    @property
    def state(self) -> str:
        """``planned`` (a dry run), ``completed`` (every device runs the version),
        ``cancelled`` (a signal stopped it), ``stopped`` (a wave failed) or ``incomplete``
        (it went through, but some device does not run the version)."""
        if self.dry_run:
            return "planned"
        if self.cancelled_by:
            return "cancelled"
        if self.stopped_at_wave is not None:
            return "stopped"
        return "completed" if self.complete else "incomplete"

    @property
    def rolled_back(self) -> str:
        """What the end of a stopped or cancelled rollout did to the devices it had updated,
        saying only what happened: which were rolled back, which could not be, or that none
        had taken the version."""
        reverted = [r.device for r in self.devices if r.state == "reverted"]
        stuck = [r.device for r in self.devices if r.reason.startswith("could not roll back")]
        said = []
        if reverted:
            said.append(f"the devices it updated were rolled back ({', '.join(reverted)})")
        if stuck:
            said.append(f"could not roll back {', '.join(stuck)} (they may run {self.label})")
        return "; ".join(said) or "no device had taken the new version: nothing to roll back"

    @property
    def complete(self) -> bool:
        """Whether every selected device runs the new version."""
        return (
            self.stopped_at_wave is None
            and not self.cancelled_by
            and all(d.state == "active" for d in self.devices)
        )


@dataclass
class DeviceState(Record):
    """What one device of a fleet runs (``robo-pipe fleet status``)."""

    device: str
    url: str
    target: str
    labels: dict[str, str]
    reachable: bool
    active: str | None = None
    staged: str | None = None
    previous: str | None = None
    locked: bool = False
    last_state: str | None = None
    """State of the device's last deployment."""
    last_version: str | None = None
    gate: str | None = None
    """Last gate result: ``passed, p99 1.23 ms`` or ``FAILED: <why>`` (None: no gate ran)."""
    error: str = ""


@dataclass(frozen=True)
class RunRecords:
    """Every stage record of one pipeline run (in memory only, for the run's summary)."""

    dataset: DatasetRef
    base: CheckpointRef | None
    checkpoint: CheckpointRef
    export: ExportRef
    evaluation: Evaluation
    latency: LatencyReport
    registration: Registration
    device: EdgeDeployment | None = None
