"""The messages between robo-pipe and a simulator's worker process.

Some simulators cannot load into robo-pipe's environment (Isaac Lab pins its own torch and
Python 3.12, Meta-World pins an older MuJoCo), so their backends run them in a child process
with the simulator environment's Python and talk to it over a socket pair. A message is an
operation name plus fields: JSON values, and numpy arrays sent as raw bytes after a JSON header
(no pickle, so the two sides' numpy versions need not match). Only the standard library and
numpy are imported here: every environment loads this module.

Each worker's module docstring lists its operations (:mod:`sim_scenes.isaaclab.worker`,
:mod:`sim_scenes.metaworld.worker`). A failure in a worker replies ``error`` with ``traceback``
(str).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import traceback
from collections.abc import Callable
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


def run_worker(serve: Callable[[Connection], None], description: str | None) -> None:
    """A worker's entry point: parse ``--fd`` (its end of the socket pair the client made),
    ``serve`` on it until the client closes, and reply ``error`` with the traceback of any
    failure ``serve`` let escape (then raise it: the worker exits non-zero, its log says why)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--fd", type=int, required=True, help="this end of the socket pair")
    args = parser.parse_args()
    conn = Connection(socket.socket(fileno=args.fd).detach())
    try:
        serve(conn)
    except Exception:
        with contextlib.suppress(OSError):
            send(conn, "error", traceback=traceback.format_exc())
        raise
    finally:
        conn.close()
