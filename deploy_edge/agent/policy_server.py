"""The edge agent's policy server, ``WS /policy``: observations in, action chunks out (frames:
:mod:`deploy_edge.wire`; the robot's client: :mod:`deploy_edge.policy_client`). The route and
its token check are :mod:`deploy_edge.agent.service`'s; this module serves an accepted socket.

Every frame a client sends is answered, and a client's mistake never costs the agent a
traceback or another client its service:

- an observation the policy cannot take (not JSON, not an ``ObservationFrame``, wrong shapes),
  or a binary frame, is answered with a ``ChunkFrame`` whose ``error`` says why; the socket then
  serves the next good observation;
- a text frame that is not UTF-8 is closed with code 1007, a frame over :data:`MAX_FRAME_MB`
  with 1009 (the WebSocket layer's checks, before the frame reaches the handler);
- a refused handshake (no, or a wrong, token) is answered ``HTTP 401``/``403`` and closed;
- a client that stops reading (neither its chunks nor the agent's pings read) is closed within
  the device config's ``stalled_client_s`` (:class:`PolicySocketProtocol`); every other
  client's socket, inference and pings go on as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from deploy_edge.agent.deployer import Deployer
from deploy_edge.wire import ChunkFrame, ObservationFrame, PolicyInfo, decode_image
from robo_pipe.errors import RoboPipeError
from robots.limits import action_fault, observation_fault

log = logging.getLogger("deploy_edge.agent")
DELAY_ENV = "ROBO_PIPE_POLICY_DELAY_MS"
"""Fault injection: milliseconds each policy-server inference sleeps before the engine runs."""
MAX_FRAME_MB = 16
"""Largest frame the policy server reads, MiB (a frame of four 224 px cameras is ~0.8 MiB);
a larger one is closed with code 1009."""
BINARY_FRAME = "binary frame: the policy server reads JSON text frames (ObservationFrame)"
"""The ``error`` of the answer to a binary frame."""


async def serve_frames(websocket: WebSocket, deployer: Deployer) -> None:
    """Serve an authorized socket until the client leaves: the :class:`PolicyInfo` frame, then
    one :class:`ChunkFrame` per frame received, in order (module docstring)."""
    await websocket.accept()
    try:
        await websocket.send_json(_policy_info(deployer).to_json())
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:  # a binary frame: no observation to read
                answer = ChunkFrame(-1, 0.0, error=BINARY_FRAME)
            else:
                answer = await asyncio.to_thread(_serve_one, deployer, text)
            await websocket.send_json(answer.to_json())
    except WebSocketDisconnect:  # gone while its answer was being sent
        return


class PolicySocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (its default, ``websockets-sansio``) with the policy
    server's rules about ending a socket (``uvicorn.Config(ws=PolicySocketProtocol,
    ws_ping_interval=..., ws_ping_timeout=...)``):

    - a handshake refused with a denial response (``HTTP 401``/``403``) is complete: uvicorn
      0.54 leaves it marked incomplete and logs ``ASGI callable returned without completing
      handshake`` at ERROR on every refusal (Kludex/uvicorn#3138);
    - a text frame that is not UTF-8 is closed with 1007 and a warning: uvicorn closes it too,
      after logging the decoding error's traceback at ERROR;
    - a client that leaves a keepalive ping unanswered past its timeout (uvicorn closes it,
      code 1011) is logged as a warning naming it; when its close cannot complete because the
      answers it left unread fill the TCP buffers, the connection is aborted (uvicorn's close
      waits for the send buffer to drain, which it never does while the client reads nothing).
    """

    async def send(self, message: Any) -> None:
        await super().send(message)
        # The denial's body is on the wire: the handshake is over (Kludex/uvicorn#3138).
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text":
            try:  # uvicorn would log the UnicodeDecodeError's traceback at ERROR, then close
                b"".join(self.frames).decode()
            except UnicodeDecodeError:
                self.frames = []
                log.warning("WS /policy: closed %s, which sent a text frame not UTF-8", self._who())
                self.conn.send_close(1007, "text frame not UTF-8")
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()

    def keepalive_timeout(self) -> None:
        if not (self.close_sent or self.transport.is_closing()):
            log.warning(
                "WS /policy: closed %s, which stopped reading (a ping unanswered for %g s)",
                self._who(),
                self.ping_timeout,
            )
        super().keepalive_timeout()
        # The close frame and whatever was before it wait in the transport's buffer: the
        # kernel's is full, so the client has stopped reading, and the close would wait forever.
        if self.transport.get_write_buffer_size():
            self.transport.abort()

    def _who(self) -> str:
        host, port = self.client or ("?", 0)
        return f"{host}:{port}"


def _policy_info(deployer: Deployer) -> PolicyInfo:
    """The first frame: the active version's shapes, or why nothing is served."""
    try:
        policy, version, _ = deployer.serving_policy()
    except RoboPipeError as err:
        return PolicyInfo(error=str(err))
    return PolicyInfo(
        version=version,
        chunk_len=policy.chunk_len,
        action_dim=policy.action_dim,
        state_dim=policy.state_dim,
        cameras=list(policy.cameras),
        image_size=policy.image_size,
        prefix_ticks=policy.prefix_ticks,
    )


def _serve_one(deployer: Deployer, text: str) -> ChunkFrame:
    """The answer to one observation frame (runs in a worker thread): the active version's
    chunk, or a frame whose ``error`` says why there is none; a state or image holding NaN or
    inf is refused (``refused: state[2] = nan``, :func:`robots.limits.non_finite`), and so is a
    chunk holding an action outside the robot's limits (``refused: the policy's actions[0, 5] =
    0.9 m: ...``, :func:`robots.limits.action_fault`)."""
    frame_id, observed_at = -1, 0.0
    try:
        frame = ObservationFrame.from_json(json.loads(text))
        frame_id, observed_at = frame.id, frame.observed_at
        policy, version, spec = deployer.serving_policy()
        images = {camera: decode_image(frame.images[camera])[None] for camera in policy.cameras}
        state = np.asarray([frame.state], dtype=np.float32)
        if refused := observation_fault({c: i[0] for c, i in images.items()}, state[0]):
            return ChunkFrame(frame_id, observed_at, error=f"refused: {refused}")
        start = time.perf_counter()
        if delay_ms := float(os.environ.get(DELAY_ENV, "0")):
            time.sleep(delay_ms / 1000.0)
        committed = {}
        if frame.prefix and frame.prefix_mask:  # what the robot executes while this infers
            committed = {
                "prefix": np.asarray([frame.prefix], dtype=np.float32),
                "prefix_mask": np.asarray([frame.prefix_mask], dtype=np.float32),
            }
        chunk = policy.infer(images, state, [frame.instruction], **committed)[0]
        inference_ms = (time.perf_counter() - start) * 1000.0
        if refused := action_fault(spec, "actions", chunk):
            return ChunkFrame(frame_id, observed_at, error=f"refused: the policy's {refused}")
    except Exception as err:  # any bad frame or engine failure: an error frame, not a dead socket
        return ChunkFrame(frame_id, observed_at, error=f"{type(err).__name__}: {err}")
    return ChunkFrame(frame_id, observed_at, chunk.tolist(), inference_ms, version)
