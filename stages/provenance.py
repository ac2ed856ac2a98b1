"""What a record was made from: the code version."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def code_version() -> str:
    """``git:<commit>[-dirty]`` of the source tree, or ``robo-pipe==<version>`` outside git."""
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
