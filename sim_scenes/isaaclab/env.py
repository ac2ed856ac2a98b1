"""Where the Isaac Lab environment is: a Python 3.12 virtual environment of its own
(``make isaaclab-env``), separate from the main one, that robo-pipe runs as a subprocess.

The main environment (Python 3.11, no Isaac Lab) imports this module.
"""

from __future__ import annotations

from pathlib import Path

from robo_pipe.errors import RoboPipeError
from sim_scenes.worker_process import simulator_python

ENV_VAR = "ROBO_PIPE_ISAACLAB_PYTHON"
"""Names the Isaac Lab environment's Python, overriding the default location."""

DEFAULT_ENV = Path("~/.cache/robo-pipe/isaaclab-3.0.0")
"""Where ``make isaaclab-env`` builds the environment (``~`` is the user's home)."""


class IsaacLabMissingError(RoboPipeError, FileNotFoundError):
    """The Isaac Lab environment's Python is not there; the message says how to create it."""


def isaaclab_python() -> Path:
    """The Isaac Lab environment's Python: ``$ROBO_PIPE_ISAACLAB_PYTHON`` if set, else
    ``~/.cache/robo-pipe/isaaclab-3.0.0/bin/python``.

    Raises:
        IsaacLabMissingError: no file there; the message names ``make isaaclab-env``.
    """
    return simulator_python("Isaac Lab", ENV_VAR, DEFAULT_ENV, "isaaclab-env", IsaacLabMissingError)
