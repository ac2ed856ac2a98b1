"""Where a pipeline run can be looked at later: its run folder under the home, its Prefect flow
run and its MLflow run, and links only to servers the user configured (never to the ports a
``robo-pipe ui`` happened to use)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from pipelines.records import PipelineResult
from pipelines.tracking import MLFLOW_CLASSIC_VIEW, mlflow_page


@dataclass(frozen=True)
class RunPlaces:
    """Where a pipeline run can be looked at later: its run folder under the home, its Prefect
    flow run and its MLflow run (names and ids, which do not depend on any server's address)."""

    home: Path
    flow_run_name: str
    flow_run_id: str
    experiment: str
    experiment_id: str
    mlflow_run_id: str
    links: dict[str, str]
    """Only links to servers the user configured (:func:`configured_links`)."""

    def relative(self, path: str | Path) -> str:
        """``path`` relative to the home (as it is when it lies outside the home)."""
        return home_relative(path, self.home)


def home_relative(path: str | Path, home: Path) -> str:
    """``path`` relative to ``home``, or as it is when it lies outside it (a base model in
    another folder)."""
    for candidate, base in ((Path(path), home), (Path(path).resolve(), home.resolve())):
        if candidate.is_relative_to(base):
            return str(candidate.relative_to(base))
    return str(path)


def configured_links(
    places: RunPlaces,
    model: str,
    version: str,
    env: dict[str, str] | None = None,
    local_prefect_api: str | None = None,
) -> dict[str, str]:
    """Links to the run's pages on servers the user configured, which a reader can follow
    later: Prefect's when ``PREFECT_UI_URL`` is set, or ``PREFECT_API_URL`` names a server other
    than ``local_prefect_api`` (the one a ``robo-pipe ui`` or ``serve`` started on this home);
    MLflow's when ``MLFLOW_TRACKING_URI`` is a tracking server (it is its own UI). None to the
    servers robo-pipe started, whose ports change from one start to the next: the summary says
    how to open the run there instead."""
    env = dict(os.environ) if env is None else env
    links = {}
    api = env.get("PREFECT_API_URL", "").rstrip("/")
    configured_api = api if api and api != (local_prefect_api or "").rstrip("/") else ""
    prefect_ui = env.get("PREFECT_UI_URL", "").rstrip("/") or configured_api.removesuffix("/api")
    if prefect_ui:
        links["Prefect flow run"] = f"{prefect_ui}/runs/flow-run/{places.flow_run_id}"
    tracking = env.get("MLFLOW_TRACKING_URI", "")
    if urlparse(tracking).scheme in ("http", "https"):
        route = f"experiments/{places.experiment_id}/runs/{places.mlflow_run_id}"
        links["MLflow run"] = mlflow_page(tracking, route)
        links["MLflow model version"] = mlflow_page(tracking, f"models/{model}/versions/{version}")
    return links


def where_to_look(result: PipelineResult, places: RunPlaces) -> list[str]:
    """The summary's last section: where the run is, and how to open it in the UIs."""
    uri = f"models:/{result.model_name}/{result.version}"
    lines = [
        "## Where to look",
        "",
        "Paths are relative to the robo-pipe home (`$ROBO_PIPE_HOME`, or the `.robo-pipe` folder "
        "robo-pipe finds from where it runs); the plots are in `plots/` beside this file.",
        "",
        f"- Run folder: `{places.relative(result.run_dir)}`.",
        f"- Registry: `{uri}`, aliases {', '.join(result.aliases)} "
        f"(`robo-pipe models show {uri}`).",
        f"- Prefect: flow run `{places.flow_run_name}` (id `{places.flow_run_id}`).",
        f"- MLflow: experiment `{places.experiment}`, run id `{places.mlflow_run_id}`.",
        "",
        "To open them: `robo-pipe ui` on this home, then the pages at these routes of the UIs "
        f"it prints: Prefect `runs/flow-run/{places.flow_run_id}`, MLflow "
        f"`#/experiments/{places.experiment_id}/runs/{places.mlflow_run_id}?"
        f"{MLFLOW_CLASSIC_VIEW}`. Set `PREFECT_UI_URL` (or use an MLflow tracking server) and "
        "the summary links to them.",
    ]
    if places.links:
        lines += ["", "On the servers configured for this run:", ""]
        lines += [f"- {label}: {url}" for label, url in places.links.items()]
    return lines
