"""The messages between robo-pipe and its Isaac Lab worker process.

Isaac Lab lives in its own Python 3.12 environment (it pins its own torch), so the backend runs it
in a child process and talks to it over a socket pair. A message is an operation name plus
fields: JSON values, and numpy arrays sent as raw bytes after a JSON header (no pickle, so the
two sides' numpy versions need not match). Only the standard library and numpy are imported
here: both environments load this module.

Operations (request -> reply; arrays batched over N environments):

- ``init`` (robot, variant, num_envs, cameras, image_size, device, retarget, phrasing,
  autoreset)
  -> ``ready`` (seconds: float).
- ``reset`` (env_ids, seeds: int64 (k,)) -> ``obs``.
- ``step`` (actions: float32 (N, action_dim)) -> ``obs`` plus reward (float32), terminated,
  truncated, success (bool), distance and distance_before (float32, m: tcp to target after and
  before the step).
- ``privileged`` -> ``privileged`` (tcp_pos, target_pos: (N, 3) m; arm_qpos: (N, n_arm) rad).
- ``close`` -> ``closed``.

``obs`` carries state (float32 (N, state_dim)), seeds (int64 (N,), each environment's current
episode), instructions (list of N str) and one uint8 (N, H, W, 3) array per camera, named
``image:<camera>``. A failure in the worker replies ``error`` with ``traceback`` (str).
"""

from __future__ import annotations

import json
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

Fields = dict[str, Any]


def send(conn: Connection, op: str, **fields: Any) -> None:
    """Send one message: ``op`` and its fields (numpy arrays travel as raw bytes)."""
    arrays = {k: np.ascontiguousarray(v) for k, v in fields.items() if isinstance(v, np.ndarray)}
    header = {
        "op": op,
        "fields": {k: v for k, v in fields.items() if k not in arrays},
        "arrays": [[k, a.dtype.str, list(a.shape)] for k, a in arrays.items()],
    }
    conn.send_bytes(json.dumps(header).encode())
    for array in arrays.values():
        conn.send_bytes(array.reshape(-1).view(np.uint8).data if array.size else b"")


def receive(conn: Connection) -> tuple[str, Fields]:
    """Receive one message: ``(op, fields)``, arrays rebuilt with their dtype and shape."""
    header = json.loads(conn.recv_bytes())
    fields: Fields = dict(header["fields"])
    for name, dtype, shape in header["arrays"]:
        buffer = conn.recv_bytes()
        # bytearray: arrays the receiver may write to, like any other observation
        fields[name] = np.frombuffer(bytearray(buffer), dtype=np.dtype(dtype)).reshape(shape)
    return header["op"], fields
