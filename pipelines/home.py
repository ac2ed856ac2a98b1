"""``$ROBO_PIPE_HOME``: the one directory everything the embedded default writes lives under.

Layout (created on demand)::

    $ROBO_PIPE_HOME/            default ./.robo-pipe
      runs/<run-id>/            one folder per CLI/pipeline run: resolved config, reports, plots
      datasets/                 collected LeRobot v3 datasets
      checkpoints/              base models and fine-tuned adapters
      exports/                  ONNX exports of fine-tuned checkpoints
      stages/                   records of completed pipeline stages (what a re-run skips)
      mlflow/                   MLflow SQLite database and artifacts
      prefect/                  PREFECT_HOME of the embedded Prefect server
      edge/                     state of the loopback edge agent
      services.json             URLs and pids of the servers `robo-pipe ui` started
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

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
)


def robo_pipe_home() -> Path:
    """The state directory: ``$ROBO_PIPE_HOME`` or ``./.robo-pipe``, as an absolute path."""
    return Path(os.environ.get("ROBO_PIPE_HOME", ".robo-pipe")).expanduser().resolve()


def home_dir(kind: str) -> Path:
    """One of :data:`SUBDIRS` under the home, created if missing."""
    if kind not in SUBDIRS:
        raise ValueError(f"unknown home directory {kind!r}; valid choices: {', '.join(SUBDIRS)}")
    path = robo_pipe_home() / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_run_dir(name: str) -> Path:
    """A fresh ``runs/<UTC time>-<slug of name>-<random>`` directory."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = home_dir("runs") / f"{stamp}-{slug(name)}-{secrets.token_hex(3)}"
    path.mkdir(parents=True)
    return path


def default_tracking_uri() -> str:
    """The embedded MLflow store: a SQLite file under the home."""
    return f"sqlite:///{home_dir('mlflow') / 'mlflow.db'}"


def default_artifact_root() -> str:
    """Where the embedded store keeps artifacts (runs, registered models)."""
    return (home_dir("mlflow") / "artifacts").as_uri()
