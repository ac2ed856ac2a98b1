"""Where the Meta-World environment is: a Python virtual environment of its own
(``make metaworld-env``), separate from the main one, that robo-pipe runs as a subprocess.

Meta-World 3.1.1 pins ``mujoco==3.3.0`` and robo-pipe runs a newer MuJoCo, so the two cannot
share a process. The main environment imports this module; it never imports Meta-World.
"""

from __future__ import annotations

from pathlib import Path

from robo_pipe.errors import RoboPipeError
from sim_scenes.worker_process import simulator_python

ENV_VAR = "ROBO_PIPE_METAWORLD_PYTHON"
"""Names the Meta-World environment's Python, overriding the default location."""

DEFAULT_ENV = Path("~/.cache/robo-pipe/metaworld-3.1.1")
"""Where ``make metaworld-env`` builds the environment (``~`` is the user's home)."""


class MetaWorldMissingError(RoboPipeError, FileNotFoundError):
    """The Meta-World environment's Python is not there; the message says how to create it."""


def metaworld_python() -> Path:
    """The Meta-World environment's Python: ``$ROBO_PIPE_METAWORLD_PYTHON`` if set, else
    ``~/.cache/robo-pipe/metaworld-3.1.1/bin/python``.

    Raises:
        MetaWorldMissingError: no file there; the message names ``make metaworld-env``.
    """
    return simulator_python(
        "Meta-World", ENV_VAR, DEFAULT_ENV, "metaworld-env", MetaWorldMissingError
    )
