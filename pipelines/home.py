"""The home: the one directory everything the embedded default writes lives under.

Which folder it is: :func:`robo_pipe.home.locate_home` (``$ROBO_PIPE_HOME``, else the nearest
``.robo-pipe`` folder here or above, else ``./.robo-pipe``, created by the first verb that
writes: read-only verbs such as ``robo-pipe info`` or ``models list`` create nothing).
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

A home is one folder that can be moved or copied: the records kept in it name the home's
paths as ``$ROBO_PIPE_HOME/...`` (:func:`robo_pipe.home.mark_home`), resolved against the home
they are read in (:func:`robo_pipe.home.unmark_home`); a checkpoint names its base checkpoint
relative to itself (:mod:`stages.policy.checkpoint`); the MLflow store, which must hold
absolute artifact locations, is rewritten to its new place when it is first opened there
(:func:`pipelines.stores.settle_in_home`).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from robo_pipe.home import HOME_FOLDER as HOME_FOLDER
from robo_pipe.home import Home as Home
from robo_pipe.home import locate_home as locate_home
from robo_pipe.home import robo_pipe_home
from robo_pipe.names import slug

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
