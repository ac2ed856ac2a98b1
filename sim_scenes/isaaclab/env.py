"""Where the Isaac Lab environment is: a Python 3.12 virtual environment of its own
(``make isaaclab-env``), separate from the main one, that robo-pipe runs as a subprocess.

Standard library only: the main environment (Python 3.11, no Isaac Lab) imports this module.
"""

from __future__ import annotations

import os
from pathlib import Path

from robo_pipe.errors import RoboPipeError

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
    configured = os.environ.get(ENV_VAR)
    python = Path(configured) if configured else DEFAULT_ENV.expanduser() / "bin" / "python"
    if not python.is_file():
        origin = f"${ENV_VAR}" if configured else "the default location"
        raise IsaacLabMissingError(
            f"{python}: no Isaac Lab Python there ({origin}); create the environment with "
            f"`make isaaclab-env`, or set ${ENV_VAR} to its python"
        )
    return python
