"""The robot side of the agent's policy server: a light computer on the robot runs the control
loop, a nearby GPU box runs the policy.

The edge agent (:mod:`deploy_edge.agent.service`) serves its active version at ``WS /policy``
(``wss://`` when the agent has TLS), with the agent's bearer token in the handshake's
``Authorization: Bearer <token>`` header (a missing or wrong token: the handshake is answered
HTTP 401). The frames are JSON text, the records below, which both sides import::

    server -> client, once on connect   PolicyInfo      what the active version needs and returns
    client -> server, per inference     ObservationFrame  images, state, instruction, an id and
                                                          the client's observation time
    server -> client, per observation   ChunkFrame      the action chunk (L, A) in robot units,
                                                          the id and observation time echoed,
                                                          inference_ms, the version served

Nothing deployed, or an observation the policy cannot take: the frame's ``error`` says why
(the connection stays open: a version deployed later is served on the next observation).

:class:`RemotePolicy` is a :class:`~deploy_edge.runtime.ChunkPolicy` over that socket, so the
asynchronous loop (:class:`~deploy_edge.runtime.AsyncControlLoop`) runs it like a local engine;
any failure (a dropped socket, a dead server, a timeout, an error frame) raises out of
``infer``, which the loop turns into the safe action, and the next call reconnects.
``python -m deploy_edge.policy_client`` runs that loop on a robot driver (see ``--help``).

Imports numpy, ``websockets`` and the robot interface (``robots``, whose specs MuJoCo reads); no
torch, no ONNX Runtime, no tokenizer: what a robot's computer has.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.runtime import AsyncControlLoop, Blend, Tick, measure_inference
from robo_pipe.records import Record
from robots.interface import Robot

POLICY_PATH = "/policy"
"""The policy server's endpoint on the agent."""
TOKEN_ENV = "ROBO_PIPE_POLICY_TOKEN"
"""Where ``python -m deploy_edge.policy_client`` reads the agent's bearer token by default."""


# -- the frames (one definition for both ends) ---------------------------------------------------


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


# -- the client ----------------------------------------------------------------------------------


class PolicyServerError(RuntimeError):
    """The policy server refused, failed or could not be reached; the message says which."""


class RemotePolicy:
    """A :class:`~deploy_edge.runtime.ChunkPolicy` served by an edge agent (module docstring).

    Connects at construction to learn the served version (``chunk_len``, ``action_dim``,
    cameras, image size); raises :class:`PolicyServerError` if it cannot. After a failure the
    socket is dropped and the next :meth:`infer` reconnects. One inference at a time (the
    asynchronous loop's single worker); not thread-safe.

    Args:
        url: ``ws://host:port`` or ``wss://host:port`` of the agent (``/policy`` is added when
            the URL has no path).
        token: the agent's bearer token.
        timeout_s: connecting, and each chunk's answer, must take at most this long.
        ca_cert: a PEM file to verify a ``wss://`` agent's certificate with (a lab CA or the
            agent's self-signed certificate); None: the system's trust store.
    """

    def __init__(
        self, url: str, token: str, timeout_s: float = 2.0, ca_cert: Path | None = None
    ) -> None:
        self.url = url if url.rstrip("/").count("/") > 2 else url.rstrip("/") + POLICY_PATH
        self.token, self.timeout_s, self.ca_cert = token, timeout_s, ca_cert
        self._socket: Any = None
        self._ids = itertools.count(1)
        self.info = self._connect()
        self.chunk_len = self.info.chunk_len
        self.version = self.info.version
        """The version of the last chunk (the first frame's before any)."""

    def infer(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> np.ndarray:
        """Mean action chunk, float32 ``(1, chunk_len, action_dim)``, robot units, for a batch
        of one: images uint8 ``(1, H, W, 3)`` by camera, state ``(1, state_dim)``. Raises on
        any failure (after dropping the socket, so the next call reconnects)."""
        if len(instructions) != 1 or state.shape[0] != 1:
            raise ValueError(f"RemotePolicy infers a batch of 1, got {len(instructions)}")
        frame = ObservationFrame(
            id=next(self._ids),
            observed_at=time.time(),
            instruction=instructions[0],
            state=[float(x) for x in state[0]],
            images={camera: encode_image(image[0]) for camera, image in images.items()},
        )
        try:
            if self._socket is None:
                self._connect()
            self._socket.send(_dumps(frame))
            answer = ChunkFrame.from_json(_loads(self._socket.recv(timeout=self.timeout_s)))
        except Exception as err:
            self.close()
            raise PolicyServerError(f"policy server {self.url}: {_why(err)}") from err
        if answer.error:
            raise PolicyServerError(f"policy server {self.url}: {answer.error}")
        if answer.id != frame.id:
            self.close()  # out of step: an answer to an earlier observation
            raise PolicyServerError(f"policy server {self.url}: answer {answer.id} to {frame.id}")
        chunk = np.asarray(answer.actions, dtype=np.float32)
        if chunk.ndim != 2 or chunk.shape[0] != self.chunk_len:
            raise PolicyServerError(
                f"policy server {self.url}: chunk of shape {chunk.shape} from {answer.version}, "
                f"expected ({self.chunk_len}, action_dim)"
            )
        self.version = answer.version
        return chunk[None]

    def close(self) -> None:
        """Drop the connection (the next :meth:`infer` reconnects)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _connect(self) -> PolicyInfo:
        from websockets.sync.client import connect

        context = None
        if self.url.startswith("wss://"):
            context = ssl.create_default_context(cafile=str(self.ca_cert) if self.ca_cert else None)
        try:
            self._socket = connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                open_timeout=self.timeout_s,
                ssl=context,
                max_size=None,
            )
            info = PolicyInfo.from_json(_loads(self._socket.recv(timeout=self.timeout_s)))
        except Exception as err:
            self.close()
            raise PolicyServerError(f"policy server {self.url}: {_why(err)}") from err
        if info.error:
            self.close()
            raise PolicyServerError(f"policy server {self.url}: {info.error}")
        return info


def _dumps(record: Record) -> str:
    return json.dumps(record.to_json(), separators=(",", ":"))


def _loads(text: str | bytes) -> dict[str, Any]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _why(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"


# -- the robot-side runner -----------------------------------------------------------------------


@dataclass
class RunSummary(Record):
    """What ``python -m deploy_edge.policy_client`` reports of one run (milliseconds)."""

    version: str
    ticks: int
    misses: int
    errors: int
    inference_p99_ms: float
    """The estimate the loop's trigger was derived from (measured or given)."""
    action_age_p50_ms: float | None
    action_age_p99_ms: float | None
    """Observation taken -> its action sent, over the ticks that sent a policy action."""
    first_error: str = ""


def probe_inference(policy: RemotePolicy, robot: Robot, instruction: str, count: int) -> float:
    """p99 (s) of ``count`` back-to-back inferences on the robot's current observation: the
    round trip the loop waits on (network, server queueing and engine together)."""
    return float(np.percentile(measure_inference(policy, robot, instruction, count, warmup=0), 99))


def run_remote(
    policy: RemotePolicy,
    robot: Robot,
    instruction: str,
    ticks: int,
    inference_s: float,
    margin_s: float = 0.02,
    blend: Blend = "linear",
) -> tuple[RunSummary, list[Tick]]:
    """``ticks`` periods of :class:`~deploy_edge.runtime.AsyncControlLoop` with ``policy`` on
    ``robot`` (connected by the caller), paced to its control rate. ValueError (the arithmetic)
    when the served chunk cannot hold the rate with ``inference_s`` + ``margin_s``."""
    with AsyncControlLoop(
        policy, robot, instruction, inference_s=inference_s, margin_s=margin_s, blend=blend
    ) as loop:
        records = loop.run(ticks)
    ages = [t.action_age_s * 1000.0 for t in records if t.action_age_s is not None]
    errors = [t.error for t in records if t.error]
    summary = RunSummary(
        version=policy.version,
        ticks=len(records),
        misses=sum(t.missed for t in records),
        errors=len(errors),
        inference_p99_ms=inference_s * 1000.0,
        action_age_p50_ms=float(np.percentile(ages, 50)) if ages else None,
        action_age_p99_ms=float(np.percentile(ages, 99)) if ages else None,
        first_error=errors[0] if errors else "",
    )
    return summary, records


def main(argv: list[str] | None = None) -> int:
    """``python -m deploy_edge.policy_client``: the asynchronous loop on a robot driver against
    an agent's policy server; prints one ``key=value`` line; exit 2 on a refusal."""
    parser = argparse.ArgumentParser(
        prog="python -m deploy_edge.policy_client",
        description="Run a robot at its control rate on the policy an edge agent serves "
        "(WS /policy): inference on the agent, actuation here, asynchronously.",
    )
    parser.add_argument("--url", required=True, help="the agent: ws://host:port or wss://...")
    parser.add_argument(
        "--token-env", default=TOKEN_ENV, help=f"variable holding the token (default {TOKEN_ENV})"
    )
    parser.add_argument("--ca-cert", type=Path, help="PEM to verify a wss:// agent with")
    parser.add_argument(
        "--driver",
        default="sim_scenes.sim_robot:simulated_rp5",
        help="module:callable(cameras, image_size) -> Robot (default: the simulated rp5)",
    )
    parser.add_argument("--instruction", default="touch the red cube")
    parser.add_argument("--ticks", type=int, default=100, help="control periods to run")
    parser.add_argument(
        "--inference-ms",
        type=float,
        help="p99 round trip the trigger is derived from (default: measured by --probes)",
    )
    parser.add_argument("--probes", type=int, default=10, help="inferences to measure it with")
    parser.add_argument("--margin-ms", type=float, default=20.0, help="added to the p99")
    parser.add_argument("--blend", choices=["linear", "none"], default="linear")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per connect and answer")
    args = parser.parse_args(argv)
    from deploy_edge.agent.config import load_driver

    token = os.environ.get(args.token_env, "")
    if not token:
        print(f"error: token variable {args.token_env} is not set", file=sys.stderr)
        return 2
    try:
        policy = RemotePolicy(args.url, token, args.timeout_s, args.ca_cert)
        robot = load_driver(args.driver)(tuple(policy.info.cameras), policy.info.image_size)
    except Exception as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    robot.connect()
    try:
        inference_s = (
            args.inference_ms / 1000.0
            if args.inference_ms is not None
            else probe_inference(policy, robot, args.instruction, args.probes)
        )
        summary, _ = run_remote(
            policy,
            robot,
            args.instruction,
            args.ticks,
            inference_s,
            args.margin_ms / 1000.0,
            args.blend,
        )
    except (ValueError, PolicyServerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        robot.stop()
        policy.close()
    print(" ".join(f"{k}={v}" for k, v in summary.to_json().items() if k != "first_error"))
    if summary.first_error:
        print(f"first error: {summary.first_error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
