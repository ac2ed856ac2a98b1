"""The Prefect flows: ``train_simulate_deploy`` (data to a registered, gated policy) and
``champion_regression`` (re-check the current champion).

``train_simulate_deploy`` runs one Prefect task per stage, each wrapping the stage's plain
function and handing the next stage a small JSON record (paths and hashes, never tensors)::

    collect -> pretrain (default VLA; cached) -> finetune -> export -> evaluate (the ONNX export,
    against the champion and the model fine-tuning started from) -> latency -> register
    -> deploy (a new champion onto the local edge agent, with ``deploy.local_agent``)

Resume: every stage's record is kept under ``$ROBO_PIPE_HOME/stages`` keyed on its inputs
(:mod:`pipelines.resume`); re-running a failed or killed run with the same config reuses the
completed stages and continues from the one that failed. Transient errors (lost connections,
dead Ray actors) are retried by Prefect.

Tracking: one MLflow run per flow run (params: the resolved config, a description with the
outcome), a nested run per stage (metrics, reports, plots), the export registered as a model
version with its lineage and gate results (:mod:`pipelines.tracking`). The flow run publishes a
markdown summary, tables and links as Prefect artifacts.

The outcome where users look: a flow run is named ``<config> · <UTC start>`` while it runs, then
``<config> · <outcome>`` (``demo · promoted v3``, ``demo · v4 BLOCKED (latency)``); a pipeline run
ends in a Completed state named after its verdict (``Promoted``, ``Blocked``, ``Refused``,
``Rollout stopped``), whose data is the :class:`PipelineResult` a caller gets back.

Crashes: a flow run holds a lock for as long as its process lives; each new flow run marks the
runs of this home whose process died without reporting as ``Crashed`` and, when it runs the same
flow on the same config, tags itself as their continuation (:mod:`pipelines.reconcile`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, cast

from prefect import flow
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext, get_run_context
from prefect.states import Completed, State
from pydantic import WithJsonSchema

from pipelines import checks, reconcile, steps, summary, tracking
from pipelines.config import PipelineConfig, load_config, save_resolved
from pipelines.home import new_run_dir, robo_pipe_home
from pipelines.records import ChampionCheck, Evaluation, FleetResult, PipelineResult, RunRecords
from pipelines.services.settings import (
    Services,
    check_services,
    configure,
    join_cluster,
    running_ui,
)
from pipelines.summary import RunPlaces
from pipelines.tasks import (
    STAGES,
    RunContext,
    collect_stage,
    deploy_stage,
    evaluate_stage,
    export_stage,
    finetune_stage,
    latency_stage,
    pretrain_stage,
    register_stage,
)
from robo_pipe.errors import InputError
from robo_pipe.locks import set_run_label
from stages.policy.types import policy_type
from stages.provenance import code_version

__all__ = ["STAGES", "champion_regression", "train_simulate_deploy"]

ConfigParam = Annotated[
    str | PipelineConfig,
    # The Prefect UI and a deployment's schedule give a path: their form shows one text field.
    WithJsonSchema({"type": "string"}),
]
"""A flow's ``config``: the pipeline config YAML, loaded and checked once, by the flow (a
scheduled run, a run started from the Prefect UI); or the config already loaded and checked
(``robo-pipe run`` and ``robo-pipe models check`` read it before the flow starts: a bad one
stops there), which the flow takes as it is. Prefect shows the run's resolved config as its
parameter then."""

DEFAULT_MLFLOW_UI = "http://127.0.0.1:5000"
DEFAULT_PREFECT_UI = "http://127.0.0.1:4200"


def _flow_run() -> FlowRun:
    run = get_run_context().flow_run  # type: ignore[union-attr]
    assert run is not None, "called outside a flow run"
    return run


def _flow_run_name() -> str:
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


def _rename_flow_run(name: str) -> None:
    """Give this flow run ``name`` in Prefect (its outcome, once known)."""
    from prefect.client.orchestration import get_client

    run = _flow_run()
    with get_client(sync_client=True) as prefect:
        prefect.set_flow_run_name(run.id, name)
    run.name = name


# -- the flows -----------------------------------------------------------------------------------


def _links(
    services: Services, run: tracking.TrackedRun, model: str, version: str
) -> dict[str, str]:
    """The run's pages on the servers this process uses (the terminal's links, valid now)."""
    flow_run = _flow_run()
    prefect_ui = services.prefect_ui or DEFAULT_PREFECT_UI
    mlflow_ui = services.mlflow_ui or DEFAULT_MLFLOW_UI
    return {
        "Prefect flow run": f"{prefect_ui}/runs/flow-run/{flow_run.id}",
        "MLflow run": run.ui_url(mlflow_ui),
        "MLflow model version": tracking.mlflow_page(
            mlflow_ui, f"models/{model}/versions/{version}"
        ),
    }


@contextmanager
def _closing(mlrun: tracking.TrackedRun, lock: reconcile.RunLock) -> Iterator[None]:
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


def _loaded(config: str | PipelineConfig, overrides: list[str] | None) -> PipelineConfig:
    """The run's config (:data:`ConfigParam`): read from its file and checked here, once, or
    as the caller loaded and checked it."""
    if isinstance(config, PipelineConfig):
        if overrides:
            raise InputError(
                f"overrides {overrides} go with a config path; a loaded config has its own applied"
            )
        return config
    cfg = load_config(config, overrides or [])
    checks.check_config(cfg)
    return cfg


def _start(
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
    cfg = _loaded(config, overrides)
    services = configure()
    check_services(services)
    join_cluster(ray_address)
    flow_run = _flow_run()
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
        found = reconcile.reconcile(active, services.prefect_ui or DEFAULT_PREFECT_UI)
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


@flow(
    name="train_simulate_deploy",
    flow_run_name=_flow_run_name,
    log_prints=True,
    persist_result=False,
)
def train_simulate_deploy(
    config: ConfigParam = "configs/demo.yaml",
    overrides: list[str] | None = None,
    ray_address: str | None = None,
) -> PipelineResult:
    """Data to a registered, gated policy: collect, pretrain (cached), fine-tune, export,
    evaluate the export, latency gate, register (see the module docstring).

    Args:
        config: pipeline config YAML; from Python also the config already loaded and checked,
            which the flow then takes as it is.
        overrides: ``FIELD=VALUE`` overrides of the YAML's fields, as ``--set``.
        ray_address: an existing Ray cluster (default: local Ray).
    """
    cfg, services, run_dir, mlrun, lock = _start(
        config, overrides, "pipeline", "train_simulate_deploy", ray_address
    )
    ctx = RunContext(cfg, run_dir, mlrun.run_id, ray_address, code_version())
    with _closing(mlrun, lock):
        dataset = collect_stage(ctx)
        base = pretrain_stage(ctx) if policy_type(cfg.policy.type).needs_pretraining else None
        checkpoint = finetune_stage(ctx, dataset, base)
        export = export_stage(ctx, checkpoint, dataset)
        evaluation = evaluate_stage(ctx, export, base, checkpoint)
        latency = latency_stage(ctx, export)
        registration = register_stage(ctx, dataset, checkpoint, export, evaluation, latency)
        device = rollout = None
        if cfg.deploy.local_agent and registration.promoted:  # only a new champion ships
            device = deploy_stage(ctx, registration)
        if cfg.deploy.fleet and registration.promoted:
            from pipelines.deploy.fleet import roll_out
            from pipelines.registry.versions import get_version

            version = get_version(registration.name, registration.version)
            rollout = roll_out(version=version, fleet=cfg.deploy.fleet)  # a stopped one too
        records = RunRecords(
            dataset, base, checkpoint, export, evaluation, latency, registration, device
        )
        result = _publish(ctx, services, mlrun, records, rollout)
    # Prefect ends the run in this state (its name the verdict) and hands a caller its data.
    final: State[PipelineResult] = Completed(
        name=summary.VERDICT_STATES[result.verdict], message=summary.outcome(result), data=result
    )
    return cast(PipelineResult, final)


def _publish(
    ctx: RunContext,
    services: Services,
    mlrun: tracking.TrackedRun,
    records: RunRecords,
    rollout: FleetResult | None = None,
) -> PipelineResult:
    """The run's result record, summary markdown, plots, Prefect artifacts, MLflow metrics and
    description; the flow run named after the outcome."""
    from pipelines.registry.versions import set_version_description

    cfg, run_dir = ctx.cfg, ctx.run_dir
    reg, evaluation, latency = records.registration, records.evaluation, records.latency
    cand = evaluation.candidate
    plots_dir = run_dir / "plots"
    plots_dir.mkdir(exist_ok=True)
    curves = summary.plot_training_curves(
        {"pretrain": records.base, "finetune": records.checkpoint},
        plots_dir / "training_curves.png",
    )
    plots = {
        "training curves": curves,
        "RL learning curves": Path(records.checkpoint.path).parent / "learning_curves.png",
        "evaluation": Path(cand.plot),
        "latency": Path(latency.histogram),
    }
    images: dict[str, Path] = {}  # the PNGs beside summary.md (a reused stage's are elsewhere)
    for name, path in plots.items():
        if path and path.is_file():
            images[name] = plots_dir / path.name
            if path != images[name]:
                shutil.copyfile(path, images[name])
    mlrun.log_artifact(plots_dir, "plots")
    result = PipelineResult(
        config_name=cfg.name,
        config_hash=cfg.config_hash(),
        run_dir=str(run_dir),
        model_name=reg.name,
        version=reg.version,
        aliases=reg.aliases,
        promoted=reg.promoted,
        blocked_by=reg.blocked_by,
        gates=reg.gates,
        dataset=records.dataset.path,
        checkpoint=records.checkpoint.path,
        export=records.export.path,
        success_rate=cand.success_rate,
        ci95=cand.ci95,
        start_success_rate=evaluation.start.success_rate if evaluation.start else None,
        warm_start_ci95=evaluation.warm_start.ci95 if evaluation.warm_start else None,
        comparison=evaluation.candidate.comparison,
        warm_start_success_rate=(
            evaluation.warm_start.success_rate if evaluation.warm_start else None
        ),
        latency_p99_ms=latency.p99_ms,
        mlflow_run_id=mlrun.run_id,
        stages=dict(ctx.stage_runs),
        links=_links(services, mlrun, reg.name, reg.version),
        device=records.device,
        rollout=rollout,
    )
    places = _places(cfg, mlrun, summary.run_title(result))
    local = running_ui()  # a ui's or serve's server: its ports are not worth a link
    local_api = local["prefect_api_url"] if local else None
    links = summary.configured_links(places, reg.name, reg.version, local_prefect_api=local_api)
    places = replace(places, links=links)
    relative = {name: f"plots/{png.name}" for name, png in images.items()}
    text = summary.markdown(result, records, relative, places)
    set_version_description(reg.name, reg.version, version_description(result, places))
    (run_dir / "summary.md").write_text(text)
    (run_dir / "result.json").write_text(json.dumps(result.to_json(), indent=1))
    mlrun.log_artifact(run_dir / "summary.md")  # beside plots/, as in the run folder
    mlrun.log_artifact(run_dir / "result.json")
    mlrun.log_metrics(
        {
            "success_rate": cand.success_rate,
            "success_ci95_low": cand.ci95[0],
            "success_ci95_high": cand.ci95[1],
            "latency_p99_ms": latency.p99_ms,
            "promoted": float(reg.promoted),
        }
    )
    mlrun.set_tags({"model_version": f"{reg.name}/{reg.version}"})
    mlrun.describe(run_description(result, places))
    slug = cfg.slug
    inline = {name: summary.data_uri(png) for name, png in images.items()}
    create_markdown_artifact(
        summary.markdown(result, records, inline, places),
        key=f"{slug}-pipeline-summary",
        description="pipeline run summary",
    )
    create_table_artifact(
        summary.evaluation_table(evaluation),
        key=f"{slug}-evaluation",
        description="held-out success, 95% intervals",
    )
    create_table_artifact(
        summary.latency_table(latency), key=f"{slug}-latency", description="latency gate"
    )
    create_table_artifact(
        summary.gates_table(reg.gates), key=f"{slug}-gates", description="promotion gates"
    )
    create_link_artifact(
        result.links["MLflow run"], link_text="MLflow run", key=f"{slug}-mlflow-run"
    )
    _rename_flow_run(places.flow_run_name)
    return result


def _places(cfg: PipelineConfig, mlrun: tracking.TrackedRun, flow_run_name: str) -> RunPlaces:
    """Where this run can be found (no links yet: :func:`summary.configured_links`)."""
    return RunPlaces(
        home=robo_pipe_home(),
        flow_run_name=flow_run_name,
        flow_run_id=str(_flow_run().id),
        experiment=cfg.name,
        experiment_id=mlrun.experiment_id,
        mlflow_run_id=mlrun.run_id,
        links={},
    )


def run_description(result: PipelineResult, places: RunPlaces) -> str:
    """The pipeline's MLflow run description (markdown): the outcome, the gates, where the
    summary is."""
    gates = "; ".join(f"{name} **{summary.gate_result(g)}**" for name, g in result.gates.items())
    low, high = result.ci95
    return (
        f"robo-pipe pipeline run of config `{result.config_name}`: "
        f"**{summary.outcome(result)}** (`models:/{result.model_name}/{result.version}`).\n\n"
        f"Gates: {gates}. Held-out success {result.success_rate:.1%} (95% CI {low:.1%} - "
        f"{high:.1%}); latency p99 {result.latency_p99_ms:.2f} ms.\n\n"
        f"The summary: `summary.md` in this run's artifacts (its plots in `plots/`), and in the "
        f"run folder `{places.relative(result.run_dir)}` under the robo-pipe home. Prefect flow "
        f"run `{places.flow_run_name}` (id `{places.flow_run_id}`)."
    )


def version_description(result: PipelineResult, places: RunPlaces) -> str:
    """The registered version's description (markdown): its gates, held-out success with its
    95% interval, latency, where it came from, and that MLflow's own alias editing and
    "Promote model" bypass the gates."""
    gates = "\n".join(
        f"- {name}: **{'passed' if g.passed else 'FAILED'}**"
        f"{'' if g.enforced else ' (not enforced)'} - {g.measured} (required {g.required})"
        for name, g in result.gates.items()
    )
    verdict = (
        "champion: every enforced gate passed"
        if result.promoted
        else f"candidate only: failed {', '.join(result.blocked_by)}"
    )
    low, high = result.ci95
    rel = places.relative
    links = "".join(f"- {label}: {url}\n" for label, url in places.links.items())
    return (
        f"Policy trained and gated by robo-pipe config `{result.config_name}` (config hash "
        f"`{result.config_hash}`); {verdict}.\n\n"
        f"Held-out success **{result.success_rate:.1%}** (95% CI {low:.1%} - {high:.1%}); "
        f"latency p99 **{result.latency_p99_ms:.2f} ms**.\n\n"
        f"Gates:\n{gates}\n\n"
        f"Lineage (paths under the robo-pipe home):\n- dataset: `{rel(result.dataset)}`\n"
        f"- checkpoint: `{rel(result.checkpoint)}`\n- export: `{rel(result.export)}`\n"
        f"- run folder: `{rel(result.run_dir)}`\n"
        f"- Prefect flow run: `{places.flow_run_name}` (id `{places.flow_run_id}`)\n"
        f"- MLflow run: `{places.mlflow_run_id}`\n{links}\n"
        "Inputs and outputs: see the signature (and `io_spec.json` for units).\n\n"
        "Promote with `robo-pipe models promote`, which refuses a version that failed a gate. "
        'MLflow\'s own alias editing and "Promote model" bypass the gates: `robo-pipe models '
        "list` and `models show` flag a champion that did not pass them."
    )


class RegressionDetected(RuntimeError):
    """The champion's held-out success fell below ``registry.promotion.min_success``."""


@flow(
    name="champion_regression",
    flow_run_name=_flow_run_name,
    log_prints=True,
    persist_result=False,
)
def champion_regression(
    config: ConfigParam = "configs/demo.yaml",
    overrides: list[str] | None = None,
    ray_address: str | None = None,
) -> ChampionCheck:
    """Evaluate the current champion on the held-out suite; fail if it fell below the
    promotion threshold (a simulator or dependency change can break a model that passed)."""
    cfg, _, run_dir, mlrun, lock = _start(
        config, overrides, "regression", "champion_regression", ray_address
    )
    with _closing(mlrun, lock):
        check = steps.evaluate_champion(cfg, run_dir / "evaluate", ray_address=ray_address)
        report = check.evaluation
        mlrun.log_metrics({"success_rate": report.success_rate, "success_ci95_low": report.ci95[0]})
        mlrun.set_tags({"model_version": f"{check.model_name}/{check.version}"})
        mlrun.log_artifact(run_dir / "evaluate", "evaluate")
        slug = cfg.slug
        verdict = "holds" if check.passed else "REGRESSED"
        title = f"{cfg.name} · champion v{check.version} {verdict}"
        mlrun.describe(
            f"robo-pipe champion check of config `{cfg.name}`: `models:/{check.model_name}/"
            f"{check.version}` **{verdict}**: held-out success {check.measured}, required "
            f"{check.required}."
        )
        create_table_artifact(
            summary.evaluation_table(Evaluation(candidate=report, champion_version=check.version)),
            key=f"{slug}-champion-regression",
            description=f"champion v{check.version}",
        )
        create_markdown_artifact(
            f"# Champion regression check: {check.model_name} v{check.version}\n\n"
            f"Held-out success: {check.measured} over {report.episodes} episodes; required "
            f"{check.required}: "
            f"**{'ok' if check.passed else 'REGRESSED'}**.\n\nReport (under the robo-pipe "
            f"home): `{summary.home_relative(report.report, robo_pipe_home())}`\n",
            key=f"{slug}-champion-regression-summary",
        )
        _rename_flow_run(title)
        if not check.passed:
            raise RegressionDetected(
                f"champion {check.model_name} v{check.version}: held-out success "
                f"{check.measured}, required {check.required}"
            )
    return check
