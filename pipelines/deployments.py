"""Prefect deployments from a config's ``schedules:`` (``robo-pipe serve``).

Each schedule becomes a deployment of one of the flows in :mod:`pipelines.flow`, named
``<flow>/<schedule name>``, with a cron (in its time zone) or an interval, and parameters that
point back at the same config file (plus the schedule's own ``set`` overrides). ``robo-pipe
serve`` registers them and runs their scheduled runs in this process's runner until stopped;
teams with a work pool deploy the same flows with ``prefect deploy`` (see ``prefect.yaml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig, ScheduleConfig
from pipelines.flow import champion_regression, train_simulate_deploy

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment
    from prefect.schedules import Schedule

FLOWS = {"train_simulate_deploy": train_simulate_deploy, "champion_regression": champion_regression}


def schedule_of(entry: ScheduleConfig) -> Schedule:
    """The Prefect schedule of one ``schedules:`` entry."""
    from prefect.schedules import Cron, Interval

    if entry.cron is not None:
        return Cron(entry.cron, timezone=entry.timezone)
    assert entry.interval_s is not None  # the config guarantees one of the two
    return Interval(entry.interval_s, timezone=entry.timezone)


def build_deployments(
    cfg: PipelineConfig,
    config_path: Path,
    overrides: list[str],
    ray_address: str | None = None,
) -> list[RunnerDeployment]:
    """One deployment per ``cfg.schedules`` entry (none if the config has no schedules)."""
    deployments: list[RunnerDeployment] = []
    for entry in cfg.schedules:
        deployments.append(
            FLOWS[entry.flow].to_deployment(  # type: ignore[arg-type]  # sync call: no coroutine
                name=entry.name,
                schedule=schedule_of(entry),
                parameters={
                    "config": str(config_path.resolve()),
                    "overrides": [*overrides, *entry.set],
                    "ray_address": ray_address,
                },
                tags=["robo-pipe", cfg.name],
                concurrency_limit=1,  # a slow run delays the next one; never two at once
                description=f"{entry.flow} of {config_path.name} "
                + (
                    f"on cron {entry.cron!r} ({entry.timezone})"
                    if entry.cron
                    else f"every {entry.interval_s:g} s"
                ),
            )
        )
    return deployments
