"""The error every task and simulator backend raises for a scene it cannot build."""

from __future__ import annotations

from robo_pipe.errors import RoboPipeError


class SceneError(RoboPipeError, ValueError):
    """An unknown task or scene variant, or an invalid scene parameter."""
