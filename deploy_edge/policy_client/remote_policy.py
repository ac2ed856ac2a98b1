"""A policy served by an edge agent's ``WS /policy``, as a local
:class:`~deploy_edge.runtime.ChunkPolicy` (see :mod:`deploy_edge.policy_client`)."""

from __future__ import annotations

import itertools
import ssl
import time
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.wire import (
    ChunkFrame,
    ObservationFrame,
    PolicyInfo,
    encode_image,
    frame_data,
    frame_text,
)
from robots.limits import observation_fault

POLICY_PATH = "/policy"
"""The policy server's endpoint on the agent."""


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
        self.prefix_ticks = self.info.prefix_ticks
        """The served version is delay-conditioned: :meth:`infer` sends the committed prefix."""
        self.version = self.info.version
        """The version of the last chunk (the first frame's before any)."""

    def infer(
        self,
        images: dict[str, np.ndarray],
        state: np.ndarray,
        instructions: list[str],
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Mean action chunk, float32 ``(1, chunk_len, action_dim)``, robot units, for a batch
        of one: images uint8 ``(1, H, W, 3)`` by camera, state ``(1, state_dim)``; for a
        delay-conditioned version the committed prefix (``(1, chunk_len, action_dim)``,
        ``(1, chunk_len)``). Raises on any failure (after dropping the socket, so the next call
        reconnects)."""
        if len(instructions) != 1 or state.shape[0] != 1:
            raise ValueError(f"RemotePolicy infers a batch of 1, got {len(instructions)}")
        # The wire carries uint8 pixels: a NaN image would arrive as some colour, unrefused.
        if refused := observation_fault({c: i[0] for c, i in images.items()}, state[0]):
            raise ValueError(f"refused before sending: {refused}")
        frame = ObservationFrame(
            id=next(self._ids),
            observed_at=time.time(),
            instruction=instructions[0],
            state=[float(x) for x in state[0]],
            images={camera: encode_image(image[0]) for camera, image in images.items()},
        )
        if prefix is not None and prefix_mask is not None:
            frame.prefix = np.asarray(prefix[0], dtype=np.float32).tolist()
            frame.prefix_mask = np.asarray(prefix_mask[0], dtype=np.float32).tolist()
        try:
            if self._socket is None:
                self._connect()
            self._socket.send(frame_text(frame))
            answer = ChunkFrame.from_json(frame_data(self._socket.recv(timeout=self.timeout_s)))
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
            info = PolicyInfo.from_json(frame_data(self._socket.recv(timeout=self.timeout_s)))
        except Exception as err:
            self.close()
            raise PolicyServerError(f"policy server {self.url}: {_why(err)}") from err
        if info.error:
            self.close()
            raise PolicyServerError(f"policy server {self.url}: {info.error}")
        return info


def _why(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"
