"""The edge agent's answers: one typed definition that the agent and every client import.

The agent (:mod:`deploy_edge.agent`) builds these records and sends their ``to_json()``; a
client (:mod:`deploy_edge.client`) reads them back with ``from_json()``, so neither side reads
the other's answers by dict key. A field added here is added on both ends at once.

    GET  /healthz                     Health
    GET  /status                      DeviceStatus (its slots: Slot; its deployments: Deployment)
    GET  /history                     [Deployment, ...], newest first
    POST /activate, POST /rollback    Deployment
    POST /episode                     EpisodeResult
"""

from __future__ import annotations

from dataclasses import dataclass, field

from robo_pipe.records import Record

STEPS = ("verify", "extract", "engine", "parity", "gate", "activate", "health", "commit")
"""The steps of a deployment on the device, in order: the names its :class:`StepResult` carry
(a rollback runs only ``activate`` and ``commit``)."""


@dataclass
class Health(Record):
    """The agent's liveness answer (no token needed)."""

    ok: bool
    device: str
    """The device's name, from its config."""


@dataclass
class StepResult(Record):
    """One step of a deployment."""

    name: str
    """One of :data:`STEPS`."""
    ok: bool
    seconds: float
    detail: str
    """What it found (or why it failed)."""


@dataclass
class GateFigures(Record):
    """The on-device latency gate's figures of one deployment (milliseconds)."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    misses: float
    """Deadline misses (a count, sent as a number like the rest)."""
    budget_ms: float
    """The p99 budget it was gated on: the release's, else the target profile's."""


@dataclass
class Slot(Record):
    """An extracted release on the device."""

    model_name: str
    model_version: str
    release: int
    path: str
    """The bundle directory."""
    sha256: str
    """Of the release file."""

    @property
    def label(self) -> str:
        """``model_name:model_version``, how a fleet names what a device runs."""
        return f"{self.model_name}:{self.model_version}"


@dataclass
class Deployment(Record):
    """One deployment (or manual rollback) and every step's result."""

    id: str
    release_sha256: str
    model_name: str
    model_version: str
    release: int
    state: str
    """``running``, ``active``, ``staged``, ``refused``, ``rolled_back`` or ``interrupted``."""
    steps: list[StepResult] = field(default_factory=list)
    reason: str = ""
    """Why it was refused or rolled back: ``<step>: <what failed>``."""
    forced: list[str] = field(default_factory=list)
    """Policy rules overridden with ``force`` (``expired``, ``downgrade``)."""
    started_at: str = ""
    finished_at: str | None = None
    gate: GateFigures | None = None
    """None until the gate step has measured."""

    @property
    def label(self) -> str:
        """``model_name:model_version`` of the version deployed."""
        return f"{self.model_name}:{self.model_version}"

    def step(self, name: str) -> StepResult | None:
        """The result of step ``name``, or None if it has not run."""
        return next((s for s in self.steps if s.name == name), None)


@dataclass
class DeviceStatus(Record):
    """What the device runs and what it is doing."""

    device: str
    target: str
    active: Slot | None
    previous: Slot | None
    staged: Slot | None
    locked: bool
    """Whether the robot-busy lock file exists (activation deferred)."""
    running: Deployment | None
    last: Deployment | None


@dataclass
class EpisodeResult(Record):
    """One episode of the active version on the device's robot."""

    version: str
    """``model_name:model_version`` of the version that ran."""
    success: bool | None
    """Whether the robot reports success (None: the driver does not say)."""
    ticks: int
    p50_ms: float
    p99_ms: float
    misses: int
    errors: int
