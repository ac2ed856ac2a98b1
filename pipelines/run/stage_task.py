"""What every stage task of a flow run shares: the stage names, the run's context, the task
options (retried on transient errors only) and :func:`run_stage`, which reuses the record of an
earlier run when a step's inputs are unchanged (:mod:`pipelines.run.resume`), logs the record to
a nested MLflow run, and reports it to the listeners of this process
(:mod:`pipelines.progress`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipelines import tracking
from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.progress import BROADCAST, describe
from pipelines.records import StageRun
from pipelines.run.resume import StageRecords, stage_key
from pipelines.services.signals import stop_behind
from robo_pipe.errors import RoboPipeError
from robo_pipe.records import Record

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R", bound=Record)


STAGES = ("collect", "pretrain", "finetune", "export", "evaluate", "latency", "register", "deploy")
"""The pipeline's stages, in order."""


@dataclass(frozen=True)
class RunContext:
    """What every stage task of one flow run shares."""

    cfg: PipelineConfig
    run_dir: Path
    mlflow_run_id: str
    ray_address: str | None
    code: str
    stage_runs: dict[str, StageRun] = field(default_factory=dict)
    """Filled as stages complete: how long each took, whether it was reused."""


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: see :func:`is_transient`."""
    return is_transient(state.result(raise_on_failure=False))


def is_transient(error: BaseException | None) -> bool:
    """Whether a stage that failed with ``error`` may succeed if run again: lost connections,
    timeouts, dead Ray workers, nodes or objects (by type, so subclasses count too). A user's
    error (bad config, bad data: every :class:`RoboPipeError`) is never retried, nor is an
    error raised inside a Ray task (Ray re-raises it as a ``RayTaskError`` that is also the
    original error's type)."""
    if error is None or isinstance(error, RoboPipeError):
        return False
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    ray_exceptions = sys.modules.get("ray.exceptions")  # not imported: not a Ray error
    if ray_exceptions is None or isinstance(error, ray_exceptions.RayTaskError):
        return False
    retryable = (
        ray_exceptions.RayActorError,  # ActorDiedError, ActorUnavailableError
        ray_exceptions.WorkerCrashedError,
        ray_exceptions.ObjectLostError,  # OwnerDiedError, ObjectReconstructionFailedError
        ray_exceptions.NodeDiedError,
        ray_exceptions.LocalRayletDiedError,
        ray_exceptions.OutOfMemoryError,
    )
    return isinstance(error, retryable)


def stage_task(name: str) -> Callable[[Callable[P, T]], Task[P, T]]:
    """The Prefect task options every stage shares."""
    return task(
        name=name,
        cache_policy=NO_CACHE,  # resume is ours: keyed on inputs, checked against the artifacts
        retries=2,
        retry_delay_seconds=5,
        retry_condition_fn=_transient,
        persist_result=False,
    )


def run_stage(
    ctx: RunContext,
    stage: str,
    inputs: dict[str, Any],
    kind: type[R],
    run: Callable[[], R],
    intact: Callable[[R], bool],
    track: Callable[[tracking.TrackedRun, R], None],
) -> R:
    """Reuse ``stage``'s record for ``inputs`` if an earlier run completed it and its artifact
    is ``intact``; else ``run`` it and store the record. Either way log it to a nested MLflow
    run with ``track``. A stage that raises stores nothing."""
    key = stage_key(stage, {**inputs, "code": ctx.code})
    records = StageRecords(home_dir("stages"))
    mlrun = tracking.TrackedRun.start(
        ctx.cfg.name, stage, ctx.mlflow_run_id, {tracking.TAG + "stage": stage}
    )
    start = time.perf_counter()
    try:
        record = records.get(stage, key, kind, intact)
        reused = record is not None
        if record is None:
            record = run()
            records.put(stage, key, record)
        else:
            get_run_logger().info("%s: reusing the record of %s", stage, records.path(stage, key))
        seconds = time.perf_counter() - start
        track(mlrun, record)
        mlrun.set_tags({tracking.TAG + "reused": reused, tracking.TAG + "stage_key": key})
        mlrun.log_metrics({"stage_seconds": seconds})
    except BaseException as err:
        mlrun.finish("FAILED")
        if isinstance(err, Exception) and (stop := stop_behind(err)) is not None:
            raise stop from None  # a stop, not a failure: the run stops as the signal asks
        raise
    mlrun.finish()
    ctx.stage_runs[stage] = StageRun(seconds=seconds, reused=reused)
    BROADCAST.finished(stage, describe(stage, record), reused)
    return record
