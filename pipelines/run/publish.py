"""What a finished pipeline run publishes: its result record and ``result.json``, the summary
markdown with its plots beside it (:mod:`pipelines.run.summary`), the Prefect artifacts, the
MLflow run's metrics and description, the registered version's description; and the flow run
renamed after the outcome."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)

from pipelines import tracking
from pipelines.config import PipelineConfig
from pipelines.home import robo_pipe_home
from pipelines.records import FleetResult, PipelineResult, RunRecords
from pipelines.run.flow_run import (
    current_flow_run,
    default_ui,
    rename_flow_run,
)
from pipelines.run.places import RunPlaces, configured_links
from pipelines.run.plots import data_uri, plot_training_curves
from pipelines.run.stage_task import RunContext
from pipelines.run.summary import gate_result, markdown, outcome, run_title
from pipelines.run.tables import evaluation_table, gates_table, latency_table
from pipelines.services.settings import Services, running_ui
from robo_pipe.home import mark_home


def _links(
    services: Services, run: tracking.TrackedRun, model: str, version: str
) -> dict[str, str]:
    """The run's pages on the servers this process uses (the terminal's links, valid now)."""
    flow_run = current_flow_run()
    default_prefect, default_mlflow = default_ui()
    prefect_ui = services.prefect_ui or default_prefect
    mlflow_ui = services.mlflow_ui or default_mlflow
    return {
        "Prefect flow run": f"{prefect_ui}/runs/flow-run/{flow_run.id}",
        "MLflow run": run.ui_url(mlflow_ui),
        "MLflow model version": tracking.mlflow_page(
            mlflow_ui, f"models/{model}/versions/{version}"
        ),
    }


def publish(
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
    curves = plot_training_curves(
        {"pretrain": records.base, "finetune": records.checkpoint},
        plots_dir / "training_curves.png",
    )
    plots = {
        "training curves": curves,
        "RL learning curves": Path(records.checkpoint.path).parent / "learning_curves.png",
        "evaluation": Path(cand.plot),
        "latency": Path(latency.histogram),
        "success against inference delay": Path(latency.report).with_name("delay_sweep.png"),
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
        rl_gain=evaluation.rl_gain,
        latency_p99_ms=latency.p99_ms,
        mlflow_run_id=mlrun.run_id,
        stages=dict(ctx.stage_runs),
        links=_links(services, mlrun, reg.name, reg.version),
        device=records.device,
        rollout=rollout,
    )
    places = _places(cfg, mlrun, run_title(result))
    local = running_ui()  # a ui's or serve's server: its ports are not worth a link
    local_api = local["prefect_api_url"] if local else None
    links = configured_links(places, reg.name, reg.version, local_prefect_api=local_api)
    places = replace(places, links=links)
    relative = {name: f"plots/{png.name}" for name, png in images.items()}
    text = markdown(result, records, relative, places)
    set_version_description(reg.name, reg.version, version_description(result, places))
    (run_dir / "summary.md").write_text(text)
    # Kept in the home, so its paths name the home as $ROBO_PIPE_HOME (`--json` prints them whole).
    (run_dir / "result.json").write_text(json.dumps(mark_home(result.to_json()), indent=1))
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
    inline = {name: data_uri(png) for name, png in images.items()}
    create_markdown_artifact(
        markdown(result, records, inline, places),
        key=f"{slug}-pipeline-summary",
        description="pipeline run summary",
    )
    create_table_artifact(
        evaluation_table(evaluation),
        key=f"{slug}-evaluation",
        description="held-out success, 95% intervals",
    )
    create_table_artifact(latency_table(latency), key=f"{slug}-latency", description="latency gate")
    create_table_artifact(
        gates_table(reg.gates), key=f"{slug}-gates", description="promotion gates"
    )
    create_link_artifact(
        result.links["MLflow run"], link_text="MLflow run", key=f"{slug}-mlflow-run"
    )
    rename_flow_run(places.flow_run_name)
    return result


def _places(cfg: PipelineConfig, mlrun: tracking.TrackedRun, flow_run_name: str) -> RunPlaces:
    """Where this run can be found (no links yet:
    :func:`~pipelines.run.places.configured_links`)."""
    return RunPlaces(
        home=robo_pipe_home(),
        flow_run_name=flow_run_name,
        flow_run_id=str(current_flow_run().id),
        experiment=cfg.name,
        experiment_id=mlrun.experiment_id,
        mlflow_run_id=mlrun.run_id,
        links={},
    )


def run_description(result: PipelineResult, places: RunPlaces) -> str:
    """The pipeline's MLflow run description (markdown): the outcome, the gates, where the
    summary is."""
    gates = "; ".join(f"{name} **{gate_result(g)}**" for name, g in result.gates.items())
    low, high = result.ci95
    return (
        f"robo-pipe pipeline run of config `{result.config_name}`: "
        f"**{outcome(result)}** (`models:/{result.model_name}/{result.version}`).\n\n"
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
