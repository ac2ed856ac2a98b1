"""The home: where it is (found the same way from any folder, as git finds ``.git``), and how
a file kept in it names its paths so that the home can be moved or copied whole.

Which folder it is:

1. ``$ROBO_PIPE_HOME``, when set;
2. else the nearest ``.robo-pipe`` folder in the current folder or one of its parents;
3. else ``./.robo-pipe``.

A file kept in the home names a path inside it as ``$ROBO_PIPE_HOME/<path>`` (:func:`mark_home`,
whichever way the home was found), and whoever reads it resolves that against the home it is
read in (:func:`unmark_home`). Its folders and the stores in it: :mod:`pipelines.home`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

T = TypeVar("T")

HOME_FOLDER = ".robo-pipe"
"""The home's folder name when it is not set by ``$ROBO_PIPE_HOME``."""


@dataclass(frozen=True)
class Home:
    """Where the home is, and how it was found."""

    path: Path
    """Absolute; it may not exist yet."""
    found: str
    """``from $ROBO_PIPE_HOME``, ``found in the current folder``, ``found in parent /x``
    or ``new, in the current folder``."""


def locate_home() -> Home:
    """The home, found as the module docstring says; nothing is created."""
    variable = os.environ.get("ROBO_PIPE_HOME")
    if variable:
        return Home(Path(variable).expanduser().resolve(), "from $ROBO_PIPE_HOME")
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / HOME_FOLDER).is_dir():
            where = "the current folder" if folder == here else f"parent {folder}"
            return Home(folder / HOME_FOLDER, f"found in {where}")
    return Home(here / HOME_FOLDER, "new, in the current folder")


def robo_pipe_home() -> Path:
    """The home's absolute path (:func:`locate_home`); it may not exist yet."""
    return locate_home().path


HOME_MARK = "$ROBO_PIPE_HOME"
"""How a record kept in the home names the home: ``$ROBO_PIPE_HOME/datasets/x`` (whichever way
the home was found), so the record still holds where the home is moved or copied."""

_PATH_END = r"(?![\w.-])"
"""Where a folder's name ends in text: ``/h`` is not the start of ``/h2`` or ``/h.old``."""


def mark_home(data: T, home: Path | None = None) -> T:
    """``data`` (a string, or JSON-like lists and dicts of them) with the home's absolute path,
    wherever a string names it (as a path or inside a ``file://`` URI), written as
    :data:`HOME_MARK`; everything else as it was."""
    folder = str(home or robo_pipe_home())
    pattern = re.compile(re.escape(folder) + _PATH_END)
    return cast(T, _map_strings(data, lambda text: pattern.sub(lambda _: HOME_MARK, text)))


def unmark_home(data: T, home: Path | None = None) -> T:
    """The inverse of :func:`mark_home`: :data:`HOME_MARK` replaced by the home's path
    (the home this process uses, which may not be the one the record was written in)."""
    folder = str(home or robo_pipe_home())
    pattern = re.compile(re.escape(HOME_MARK) + _PATH_END)
    return cast(T, _map_strings(data, lambda text: pattern.sub(lambda _: folder, text)))


def _map_strings(data: Any, change: Callable[[str], str]) -> Any:
    if isinstance(data, str):
        return change(data)
    if isinstance(data, dict):
        return {key: _map_strings(value, change) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_map_strings(value, change) for value in data]
    return data
