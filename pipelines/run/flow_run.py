"""One flow run's own bookkeeping: its name (``<config> · <UTC start>`` while it runs, its
outcome after), its start (the config read and checked once, the services and the Ray cluster
checked, the run folder, the MLflow run, the liveness lock, earlier runs found crashed) and its
end (the MLflow run finished, the lock released).

Stops: a flow run that a signal stopped (Ctrl-C, SIGTERM: the user's choice, not a crash) ends
``Cancelled`` (:func:`cancelled_if_stopped`); the same command resumes it.

Crashes: a flow run holds a lock for as long as its process lives; each new flow run marks the
runs of this home whose process died without reporting as ``Crashed`` and, when it runs the same
flow on the same config, tags itself as their continuation (:mod:`pipelines.run.reconcile`).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import Flow
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext, get_run_context
from prefect.states import State

from pipelines import tracking
from pipelines.config import PipelineConfig, load_config, save_resolved
from pipelines.home import new_run_dir
from pipelines.run import reconcile
from pipelines.services.local_servers import preferred_ports
from pipelines.services.settings import Services, check_services, configure, join_cluster
from pipelines.steps import checks
from robo_pipe.errors import InputError
from robo_pipe.locks import set_run_label


def default_ui() -> tuple[str, str]:
    """Where ``robo-pipe ui`` puts the Prefect UI and the MLflow UI when their ports are free:
    the run's links point there when no server is known."""
    prefect_port, mlflow_port = preferred_ports()
    return f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"


def current_flow_run() -> FlowRun:
    run = get_run_context().flow_run  # type: ignore[union-attr]
    assert run is not None, "called outside a flow run"
    return run


def flow_run_name() -> str:
    """``<config name> · <UTC start>``: a flow run's name until its outcome is known (a config
    given as a path is named after its file: the flow reads the file later, once)."""
    context = FlowRunContext.get()
    config: Any = (context.parameters or {}).get("config") if context else None
    if isinstance(config, PipelineConfig):
        name = config.name
    elif isinstance(config, str | Path):
        name = Path(config).stem
    else:
        name = context.flow.name if context and context.flow else "robo-pipe"
    return f"{name} · {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}"


def cancelled_if_stopped(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """The flows' ``on_crashed`` hook: a flow run that a stop signal ended (SIGINT, SIGTERM,
    raised as ``KeyboardInterrupt``, or as Prefect's ``TerminationSignal`` while its engine
    holds SIGTERM) is set ``Cancelled``, not ``Crashed``: nothing failed, and the same command
    resumes it. Prefect calls the hook while it handles the exception that ended the run (so
    ``sys.exc_info`` names it), after it set the run ``Crashed``. A run whose Prefect server
    stopped answering (:class:`pipelines.services.signals.ServerLost`) stays as it is."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import TerminationSignal
    from prefect.states import Cancelled

    from pipelines.services.signals import ServerLost, stop_signal

    stop = sys.exc_info()[1]
    if isinstance(stop, ServerLost) or not isinstance(stop, KeyboardInterrupt | TerminationSignal):
        return
    signum = stop_signal(stop) if isinstance(stop, KeyboardInterrupt) else stop.signal
    message = f"stopped by {signal.Signals(signum).name}: the same command resumes the run"
    with get_client(sync_client=True) as prefect:
        prefect.set_flow_run_state(flow_run.id, Cancelled(message=message), force=True)


def rename_flow_run(name: str) -> None:
    """Give this flow run ``name`` in Prefect (its outcome, once known)."""
    from prefect.client.orchestration import get_client

    run = current_flow_run()
    with get_client(sync_client=True) as prefect:
        prefect.set_flow_run_name(run.id, name)
    run.name = name


@contextmanager
def closing(mlrun: tracking.TrackedRun, lock: reconcile.RunLock) -> Iterator[None]:
    """End the flow's MLflow run (FAILED if the block raised) and release its liveness lock."""
    try:
        yield
    except BaseException as err:
        try:
            mlrun.finish("FAILED")
        except Exception as finishing:  # e.g. the SQLite store locked under a Ctrl-C/SIGTERM
            # What stopped the run (an interrupt, the real error) is what the caller must see;
            # the MLflow run stays RUNNING and the next run's reconcile ends it.
            err.add_note(f"ending the MLflow run {mlrun.run_id} failed too: {finishing}")
        raise
    finally:
        lock.release()
    mlrun.finish()


def loaded_config(config: str | PipelineConfig, overrides: list[str] | None) -> PipelineConfig:
    """The run's config (:data:`pipelines.run.flow.ConfigParam`): read from its file and
    checked here, once, or as the caller loaded and checked it."""
    if isinstance(config, PipelineConfig):
        if overrides:
            raise InputError(
                f"overrides {overrides} go with a config path; a loaded config has its own applied"
            )
        return config
    cfg = load_config(config, overrides or [])
    checks.check_config(cfg)
    return cfg


def start_run(
    config: str | PipelineConfig,
    overrides: list[str] | None,
    kind: str,
    flow_name: str,
    ray_address: str | None,
) -> tuple[PipelineConfig, Services, Path, tracking.TrackedRun, reconcile.RunLock]:
    """Take the config (loaded and checked before any stage), check the services and the Ray
    cluster (if one is named: it answers, accepts us and shares the home), open the run folder
    and the MLflow run, take this run's liveness lock (release it when the run ends) and mark
    earlier runs whose process died as crashed."""
    cfg = loaded_config(config, overrides)
    services = configure()
    check_services(services)
    join_cluster(ray_address)
    flow_run = current_flow_run()
    set_run_label(flow_run.name)  # whoever waits for an output this run writes sees its name
    run_dir = new_run_dir(f"{cfg.name}-{kind}")
    save_resolved(cfg, run_dir / "config.yaml")
    mlrun = tracking.TrackedRun.start(
        cfg.name,
        f"{kind}-{flow_run.name}",
        tags={
            tracking.TAG + "kind": kind,
            tracking.TAG + "config_hash": cfg.config_hash(),
            tracking.TAG + "prefect_flow_run_id": str(flow_run.id),
            tracking.TAG + "run_dir": str(run_dir),
        },
    )
    mlrun.log_params(cfg.model_dump(mode="json"))
    mlrun.log_artifact(run_dir / "config.yaml")
    mlrun.describe(
        f"robo-pipe {kind} run of config `{cfg.name}` (config hash `{cfg.config_hash()}`), "
        f"Prefect flow run `{flow_run.name}`: running."
    )
    active = reconcile.new_active_run(
        str(flow_run.id), flow_run.name, flow_name, cfg.config_hash(), mlrun.run_id
    )
    lock = reconcile.hold(active)
    try:
        found = reconcile.reconcile(active, services.prefect_ui or default_ui()[0])
    except Exception as err:  # bookkeeping of earlier runs must not stop this one
        print(f"could not check earlier runs for crashes: {type(err).__name__}: {err}")
        found = []
    for dead in found:
        print(
            f"flow run '{dead.run.flow_run_name}' ({dead.run.flow}, started {dead.run.started}) "
            f"was {dead.state_before} but its process {dead.run.pid} is gone: marked Crashed"
            + ("; this run continues it" if dead.continued else "")
        )
    return cfg, services, run_dir, mlrun, lock
