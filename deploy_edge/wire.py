"""The edge agent's answers: one typed definition that the agent and every client import.

The agent (:mod:`deploy_edge.agent`) builds these records and sends their ``to_json()``; a
client (:mod:`deploy_edge.client`) reads them back with ``from_json()``, so neither side reads
the other's answers by dict key. A field added here is added on both ends at once.

    GET  /healthz                     Health
    GET  /status                      DeviceStatus (its slots: Slot; its deployments: Deployment)
    GET  /history                     [Deployment, ...], newest first
    POST /activate, POST /rollback    Deployment (their bodies may carry an Origin)
    POST /unstage                     Deployment (the staged one, now "unstaged")
    POST /episode                     EpisodeResult
    GET  /uploads                     [Upload, ...]; GET/PUT/DELETE /uploads/{sha256}: Upload

The policy server (``WS /policy``, :mod:`deploy_edge.agent.service`; its robot-side client
:mod:`deploy_edge.policy_client`) speaks JSON text frames, the records at the end of this
module::

    server -> client, once on connect   PolicyInfo        what the active version needs and
                                                          returns
    client -> server, per inference     ObservationFrame  images, state, instruction, an id and
                                                          the client's observation time
    server -> client, per observation   ChunkFrame        the action chunk (L, A) in robot
                                                          units, the id and observation time
                                                          echoed, inference_ms, the version
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    mode: str = "sync"
    """The control loop it was gated in (the target profile's ``mode``): in ``async`` the
    percentiles above are the actuation tick's, and the figures below say how fresh and smooth
    the actions were."""
    inference_p99_ms: float | None = None
    """``async``: one inference alone, p99."""
    action_age_p99_ms: float | None = None
    """``async``: observation taken -> action sent, p99."""
    seam_jump_max: float | None = None
    """``async``: the largest change of the action at a chunk seam, robot units."""
    instruction_encode_p50_ms: float | None = None
    """A bundle with an instruction graph: encoding the instruction, once per episode (not
    in the per-tick figures above), p50; None: the policy graph takes the tokens."""


@dataclass
class Trial(Record):
    """One way the device (or the pipeline's gate) can run a bundle, and what became of it
    when a target profile says ``precision: auto``: built, parity-checked, gated, then chosen
    or not by :func:`deploy_edge.precision.choose_variant`."""

    variant: str
    """``fp32`` (the FP32 model), ``fp16`` (the FP32 model built in FP16 by TensorRT), or the
    name of a bundle variant (``int8``)."""
    precision: str
    """Its numeric precision (a key of :data:`deploy_edge.precision.VARIANTS`)."""
    relative_error: float | None
    """Its error against the FP32 model relative to each action dimension's std: as the
    export scored it (0 for FP32), or for an option the export did not score (TensorRT's FP16
    build of the FP32 model) as the device measured it on the bundle's reference inputs at
    parity; None: not measured, ranked after every measured one."""
    candidate: bool = True
    """Whether the bundle lets it run at all (its export-time error bar and success test)."""
    failure: str = ""
    """Why it is out: not a candidate, the engine failed to build, its parity or its latency
    gate failed ("" while it is still in)."""
    p99_ms: float | None = None
    """Its control step's p99 in the latency gate (None: not measured)."""
    misses: int = 0
    """Deadline misses in that gate."""
    chosen: bool = False
    """Whether it is the one that runs."""

    def fits(self, budget_ms: float) -> bool:
        """Built, parity within tolerance, gate passed (no failure) and p99 <= ``budget_ms``."""
        return (
            self.candidate
            and not self.failure
            and self.p99_ms is not None
            and self.p99_ms <= budget_ms
        )


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
    content_sha256: str = ""
    """Of the bundle's files (:attr:`deploy_edge.release.manifest.Manifest.content_sha256`):
    what the slot holds, however it was signed ("": a slot recorded before this field)."""
    variant: str = ""
    """What of the bundle runs (:attr:`Trial.variant`): the FP32 model or a precision
    variant, as the target profile pinned it or ``precision: auto`` chose it ("": a slot
    recorded before variants, run as the profile pins it)."""
    precision: str = ""
    """The precision :attr:`variant` runs in, as the trials recorded it ("": a slot recorded
    before precisions, :func:`deploy_edge.targets.running_option`)."""
    systems_test: bool = False
    """Deployed as a systems test (a random-weights policy, for measurements only)."""
    expires_at: str | None = None
    """The signed manifest's expiry (ISO 8601, UTC; None: never): checked at install; an
    expired active release keeps running and the device's status says so."""

    @property
    def label(self) -> str:
        """``model_name:model_version``, how a fleet names what a device runs."""
        return f"{self.model_name}:{self.model_version}"


@dataclass
class Origin(Record):
    """Who asked the device for an action (a deployment, an activation, a rollback, an
    unstage): sent in the request's body, kept on the :class:`Deployment` in the agent's
    history, so that a device's history says which rollout changed it."""

    by: str = "cli"
    """``cli`` (a person's robo-pipe command) or ``fleet`` (a fleet rollout, its revert
    included)."""
    rollout: str = ""
    """The fleet rollout's id ("" outside a rollout)."""
    flow_run: str = ""
    """The Prefect flow run's URL ("" outside a flow)."""


@dataclass
class Deployment(Record):
    """One deployment (or manual rollback) and every step's result."""

    id: str
    release_sha256: str
    model_name: str
    model_version: str
    release: int
    state: str
    """``running``, ``active``, ``staged``, ``refused``, ``rolled_back``, ``interrupted`` or
    ``unstaged`` (a staged version dropped before it was activated)."""
    steps: list[StepResult] = field(default_factory=list)
    reason: str = ""
    """Why it was refused or rolled back: ``<step>: <what failed>``."""
    forced: list[str] = field(default_factory=list)
    """Policy rules overridden with ``force`` (``expired``, ``downgrade``)."""
    started_at: str = ""
    finished_at: str | None = None
    gate: GateFigures | None = None
    """None until the gate step has measured (with ``precision: auto``: the chosen one's)."""
    variant: str = ""
    """What of the bundle runs (:attr:`Trial.variant`; "" until the engine step)."""
    trials: list[Trial] = field(default_factory=list)
    """With ``precision: auto``: every way the bundle could run and why each was or was not
    chosen; empty for a pinned precision."""
    choice: str = ""
    """Why :attr:`variant` runs (the choice's one line; "" for a pinned precision)."""
    systems_test: bool = False
    """The deploy said it is a systems test: a random-weights release may go live."""
    origin: Origin | None = None
    """Who asked for it, as the request said (None: the request did not say, or a record
    written before origins)."""

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
    floor: dict[str, int] = field(default_factory=dict)
    """Model name -> the highest release of it this device ever installed: an install below
    it needs ``force``; a rollback does not lower it."""
    notices: list[str] = field(default_factory=list)
    """What an operator should know: state lost at start (the floor rebuilt or gone), an
    expired active release."""


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
    reason: str = ""
    """Why the robot ended the episode itself, e.g. a lost publisher or the e-stop of a ROS 2
    arm (:attr:`robots.ros2.driver.Ros2Robot.reason`); "" when it ran to its end."""


@dataclass
class Upload(Record):
    """A release file on its way to the device (``GET /uploads``, ``GET/PUT/DELETE
    /uploads/{sha256}``; the rules: :class:`deploy_edge.agent.uploads.UploadStore`)."""

    sha256: str
    """The release file's sha256, which names the upload."""
    received: int
    """Bytes on the device."""
    size: int | None
    """The declared total, bytes (None: nothing uploaded)."""
    age_s: float
    """Seconds since its last byte was written."""
    complete: bool
    """Every byte received and hashed to ``sha256``: ready to deploy."""


@dataclass
class Sent(Record):
    """What an upload sent (the deploying client's figures, not the device's record)."""

    size: int
    """The release file, bytes."""
    sent: int
    """Bytes sent this time (0: the device had the whole release already)."""
    pieces: int = 0
    """Pieces of the release (:mod:`deploy_edge.release.pieces`); 0: sent whole, from the
    bytes the device had (an agent without delta uploads)."""
    pieces_sent: int = 0
    """Of them, the pieces the device lacked and was sent."""
    seconds: float = 0.0

    @property
    def summary(self) -> str:
        """``12.3 of 1187.0 MB sent (1.0%)``, with the pieces the device held."""
        share = f" ({100.0 * self.sent / self.size:.1f}%)" if self.size else ""
        held = (
            f"; the device held {self.pieces - self.pieces_sent} of {self.pieces} pieces"
            if self.pieces
            else ""
        )
        return f"{self.sent / 1e6:.1f} of {self.size / 1e6:.1f} MB sent{share}{held}"


# -- the policy server's frames (WS /policy) -----------------------------------------------------


@dataclass
class EncodedImage(Record):
    """One camera image: uint8 ``(H, W, 3)``, row-major bytes, base64."""

    shape: list[int]
    data: str


@dataclass
class PolicyInfo(Record):
    """The server's first frame: what the active version takes and returns."""

    version: str = ""
    """``model:version`` served ("" with an error)."""
    chunk_len: int = 0
    action_dim: int = 0
    state_dim: int = 0
    cameras: list[str] = field(default_factory=list)
    image_size: int = 0
    """Images are ``(image_size, image_size, 3)`` uint8."""
    error: str = ""
    """Why nothing can be served now ("" when it can)."""
    prefix_ticks: int = 0
    """A delay-conditioned version: the committed actions it takes with each observation
    (:attr:`ObservationFrame.prefix`); 0: none (and every server before it)."""


@dataclass
class ObservationFrame(Record):
    """One observation to infer a chunk from."""

    id: int
    """The client's counter; echoed in the answer."""
    observed_at: float
    """When the observation was taken, on the client's clock (s); echoed in the answer."""
    instruction: str
    state: list[float]
    """``(state_dim,)``, robot units."""
    images: dict[str, EncodedImage]
    """By camera name."""
    prefix: list[list[float]] = field(default_factory=list)
    """For a delay-conditioned version: the committed prefix ``(chunk_len, action_dim)``,
    robot units (:func:`deploy_edge.async_loop.committed_prefix`); empty: none."""
    prefix_mask: list[float] = field(default_factory=list)
    """``(chunk_len,)``: 1 for each committed action; empty: none."""


@dataclass
class ChunkFrame(Record):
    """The answer to one :class:`ObservationFrame`."""

    id: int
    observed_at: float
    actions: list[list[float]] = field(default_factory=list)
    """``(chunk_len, action_dim)``, robot units (empty with an error)."""
    inference_ms: float = 0.0
    """The engine's time on this observation (the server's queueing not included)."""
    version: str = ""
    """``model:version`` that computed it."""
    error: str = ""


def encode_image(image: np.ndarray) -> EncodedImage:
    """``image`` uint8 ``(H, W, 3)`` as a frame field."""
    pixels = np.ascontiguousarray(image, dtype=np.uint8)
    return EncodedImage(list(pixels.shape), base64.b64encode(pixels.tobytes()).decode("ascii"))


def decode_image(image: EncodedImage) -> np.ndarray:
    """The uint8 array of an :class:`EncodedImage`; ValueError if the bytes do not fit the
    shape."""
    pixels = np.frombuffer(base64.b64decode(image.data, validate=True), dtype=np.uint8)
    return pixels.reshape(image.shape)


def frame_text(record: Record) -> str:
    """A frame as the JSON text sent on the socket."""
    return json.dumps(record.to_json(), separators=(",", ":"))


def frame_data(text: str | bytes) -> dict[str, Any]:
    """The JSON object of a frame's text (ValueError: not JSON, or not an object)."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data
