"""The Prefect flows: ``train_simulate_deploy`` (data to a registered, gated policy) and
``champion_regression`` (re-check the current champion).

``train_simulate_deploy`` runs one Prefect task per stage (:mod:`pipelines.run.tasks`), each
wrapping the stage's step and handing the next stage a small JSON record (paths and hashes,
never tensors)::

    collect -> pretrain (default VLA; cached) -> finetune -> export -> evaluate (the ONNX export,
    against the champion and the model fine-tuning started from) -> latency -> register
    -> deploy (a new champion onto the local edge agent, with ``deploy.local_agent``)

Resume: every stage's record is kept under ``$ROBO_PIPE_HOME/stages`` keyed on its inputs
(:mod:`pipelines.run.resume`); re-running a failed or killed run with the same config reuses the
completed stages and continues from the one that failed. Transient errors (lost connections,
dead Ray actors) are retried by Prefect.

Tracking: one MLflow run per flow run (params: the resolved config, a description with the
outcome), a nested run per stage (metrics, reports, plots), the export registered as a model
version with its lineage and gate results (:mod:`pipelines.tracking`). The flow run publishes a
markdown summary, tables and links as Prefect artifacts (:mod:`pipelines.run.publish`).

The outcome where users look: a flow run is named ``<config> · <UTC start>`` while it runs, then
``<config> · <outcome>`` (``demo · promoted v3``, ``demo · v4 BLOCKED (latency)``); a pipeline run
ends in a Completed state named after its verdict (``Promoted``, ``Blocked``, ``Refused``,
``Rollout stopped``), whose data is the :class:`PipelineResult` a caller gets back.

Crashes: each flow run holds a liveness lock and marks earlier runs whose process died as
``Crashed`` (:mod:`pipelines.run.flow_run`).
"""

from __future__ import annotations

from typing import Annotated, cast

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.states import Completed, State
from pydantic import WithJsonSchema

from pipelines.config import PipelineConfig
from pipelines.home import robo_pipe_home
from pipelines.records import ChampionCheck, Evaluation, PipelineResult, RunRecords
from pipelines.run.flow_run import (
    cancelled_if_stopped,
    closing,
    flow_run_name,
    rename_flow_run,
    start_run,
)
from pipelines.run.places import home_relative
from pipelines.run.publish import publish
from pipelines.run.stage_task import RunContext
from pipelines.run.summary import VERDICT_STATES, outcome
from pipelines.run.tables import evaluation_table
from pipelines.run.tasks import (
    collect_stage,
    deploy_stage,
    evaluate_stage,
    export_stage,
    finetune_stage,
    latency_stage,
    pretrain_stage,
    register_stage,
)
from pipelines.steps.evaluate import evaluate_champion
from stages.policy.types import policy_type
from stages.provenance import code_version

__all__ = ["champion_regression", "train_simulate_deploy"]


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


@flow(
    name="train_simulate_deploy",
    flow_run_name=flow_run_name,
    log_prints=True,
    persist_result=False,
    on_crashed=[cancelled_if_stopped],  # a stop signal: Cancelled, not Crashed
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
    cfg, services, run_dir, mlrun, lock = start_run(
        config, overrides, "pipeline", "train_simulate_deploy", ray_address
    )
    ctx = RunContext(cfg, run_dir, mlrun.run_id, ray_address, code_version())
    with closing(mlrun, lock):
        dataset = collect_stage(ctx)
        base = pretrain_stage(ctx) if policy_type(cfg.policy.type).needs_pretraining else None
        checkpoint = finetune_stage(ctx, dataset, base)
        export = export_stage(ctx, checkpoint, dataset)
        evaluation = evaluate_stage(ctx, export, base, checkpoint)
        latency = latency_stage(ctx, export, evaluation)
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
        result = publish(ctx, services, mlrun, records, rollout)
    # Prefect ends the run in this state (its name the verdict) and hands a caller its data.
    final: State[PipelineResult] = Completed(
        name=VERDICT_STATES[result.verdict], message=outcome(result), data=result
    )
    return cast(PipelineResult, final)


class RegressionDetected(RuntimeError):
    """The champion's held-out success fell below ``registry.promotion.min_success``."""


@flow(
    name="champion_regression",
    flow_run_name=flow_run_name,
    log_prints=True,
    persist_result=False,
    on_crashed=[cancelled_if_stopped],  # a stop signal: Cancelled, not Crashed
)
def champion_regression(
    config: ConfigParam = "configs/demo.yaml",
    overrides: list[str] | None = None,
    ray_address: str | None = None,
) -> ChampionCheck:
    """Evaluate the current champion on the held-out suite; fail if it fell below the
    promotion threshold (a simulator or dependency change can break a model that passed)."""
    cfg, _, run_dir, mlrun, lock = start_run(
        config, overrides, "regression", "champion_regression", ray_address
    )
    with closing(mlrun, lock):
        check = evaluate_champion(cfg, run_dir / "evaluate", ray_address=ray_address)
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
            evaluation_table(Evaluation(candidate=report, champion_version=check.version)),
            key=f"{slug}-champion-regression",
            description=f"champion v{check.version}",
        )
        create_markdown_artifact(
            f"# Champion regression check: {check.model_name} v{check.version}\n\n"
            f"Held-out success: {check.measured} over {report.episodes} episodes; required "
            f"{check.required}: "
            f"**{'ok' if check.passed else 'REGRESSED'}**.\n\nReport (under the robo-pipe "
            f"home): `{home_relative(report.report, robo_pipe_home())}`\n",
            key=f"{slug}-champion-regression-summary",
        )
        rename_flow_run(title)
        if not check.passed:
            raise RegressionDetected(
                f"champion {check.model_name} v{check.version}: held-out success "
                f"{check.measured}, required {check.required}"
            )
    return check
