"""The home: the one directory everything the embedded default writes lives under.

Which folder it is, found the same way from any folder (as git finds ``.git``):

1. ``$ROBO_PIPE_HOME``, when set;
2. else the nearest ``.robo-pipe`` folder in the current folder or one of its parents;
3. else ``./.robo-pipe``, created by the first verb that writes (read-only verbs such as
   ``robo-pipe info`` or ``models list`` create nothing).

``robo-pipe info`` says which of these it was. Layout (each folder created on demand)::

    <home>/
      runs/<run-id>/            one folder per CLI/pipeline run: resolved config, reports, plots
      datasets/                 collected LeRobot v3 datasets
      checkpoints/              base models and fine-tuned adapters
      exports/                  ONNX exports of fine-tuned checkpoints
      releases/                 signed releases (robo-pipe bundle, deploy)
      keys/                     the signing key pair (robo-pipe keys generate)
      stages/                   records of completed pipeline stages (what a re-run skips)
      mlflow/                   MLflow SQLite database and artifacts
      prefect/                  PREFECT_HOME of the embedded Prefect server
      edge/                     state of the loopback edge agent
      rollouts/                 one record per fleet rollout (pipelines.deploy.rollouts)
      services.json             URLs and pids of the servers `robo-pipe ui` started

A home is one folder that can be moved or copied: the records the pipeline keeps in it name
the home's paths as ``$ROBO_PIPE_HOME/...`` (:func:`home_relative`), resolved against the home
they are read in (:func:`home_absolute`); the MLflow store, which must hold absolute artifact
locations, is rewritten to its new place when it is first opened there
(:func:`pipelines.stores.settle_in_home`).
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar, cast

from robo_pipe.names import slug

T = TypeVar("T")

HOME_FOLDER = ".robo-pipe"
"""The home's folder name when it is not set by ``$ROBO_PIPE_HOME``."""

SUBDIRS = (
    "runs",
    "datasets",
    "checkpoints",
    "exports",
    "releases",
    "keys",
    "stages",
    "mlflow",
    "prefect",
    "edge",
    "rollouts",
)


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


def home_path(kind: str) -> Path:
    """One of :data:`SUBDIRS` under the home, as a path (nothing is created)."""
    if kind not in SUBDIRS:
        raise ValueError(f"unknown home directory {kind!r}; valid choices: {', '.join(SUBDIRS)}")
    return robo_pipe_home() / kind


def home_dir(kind: str) -> Path:
    """One of :data:`SUBDIRS` under the home, created if missing (for verbs that write)."""
    path = home_path(kind)
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_dir(name: str) -> Path:
    """A fresh ``runs/<UTC time>-<slug of name>-<random>`` directory."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = home_dir("runs") / f"{stamp}-{slug(name)}-{secrets.token_hex(3)}"
    path.mkdir(parents=True)
    return path


def default_tracking_uri() -> str:
    """The embedded MLflow store: a SQLite file under the home (its folder is made by
    whoever opens it: :func:`pipelines.services.settings.configure`, :mod:`pipelines.stores`)."""
    return f"sqlite:///{home_path('mlflow') / 'mlflow.db'}"


def default_artifact_root() -> str:
    """Where the embedded store keeps artifacts (runs, registered models)."""
    return (home_path("mlflow") / "artifacts").as_uri()


HOME_MARK = "$ROBO_PIPE_HOME"
"""How a record kept in the home names the home: ``$ROBO_PIPE_HOME/datasets/x`` (whichever way
the home was found), so the record still holds where the home is moved or copied."""

_PATH_END = r"(?![\w.-])"
"""Where a folder's name ends in text: ``/h`` is not the start of ``/h2`` or ``/h.old``."""


def home_relative(data: T, home: Path | None = None) -> T:
    """``data`` (a string, or JSON-like lists and dicts of them) with the home's absolute path,
    wherever a string names it (as a path or inside a ``file://`` URI), written as
    :data:`HOME_MARK`; everything else as it was."""
    folder = str(home or robo_pipe_home())
    pattern = re.compile(re.escape(folder) + _PATH_END)
    return cast(T, _map_strings(data, lambda text: pattern.sub(lambda _: HOME_MARK, text)))


def home_absolute(data: T, home: Path | None = None) -> T:
    """The inverse of :func:`home_relative`: :data:`HOME_MARK` replaced by the home's path
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
