"""What a record was made from: the code version."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
"""The source checkout this code runs from, or the directory it is installed into
(site-packages, or a ``pip install --target`` folder) when it is installed from a wheel."""


def _in_checkout() -> bool:
    """Whether this code runs from robo-pipe's own source tree (an editable install or the
    repository): only then does the enclosing git repository say what the code is. An installed
    copy may sit inside some other repository (a venv in a project's checkout)."""
    return (_ROOT / "pyproject.toml").is_file() and (_ROOT / "stages" / "provenance.py").is_file()


def code_version() -> str:
    """``git:<commit>[-dirty]`` of the source checkout, or ``robo-pipe==<version>`` when this
    is an installed copy (or git is missing); ``unknown`` when neither says."""
    if _in_checkout():
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=10
            )
            if commit.returncode == 0:
                dirty = subprocess.run(
                    ["git", "status", "--porcelain", "--untracked-files=no"],
                    cwd=_ROOT,
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                suffix = "-dirty" if dirty.stdout.strip() else ""
                return f"git:{commit.stdout.strip()}{suffix}"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return f"robo-pipe=={metadata.version('robo-pipe')}"
    except metadata.PackageNotFoundError:
        return "unknown"
