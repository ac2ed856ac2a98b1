"""The ``robo-pipe`` command line: one verb per job, each a thin layer over a stage or flow.

Every verb that produces something accepts ``--json`` and then prints its result record as one
JSON line, last. Errors in configs, robots or scenes print one line per problem and exit 2.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from pipelines.config import ConfigError, PipelineConfig, load_config
from robots.spec import RobotDefinitionError, available_robots, get_robot
from sim_scenes.touch import VARIANTS, SceneError
from stages.dataset.writer import DatasetError
from stages.ray_runtime import RayClusterError

if TYPE_CHECKING:  # the policy stack imports torch: keep `robo-pipe --help` fast
    from pipelines.services import Services
    from stages.dataset.layout import DatasetRef
    from stages.finetune.config import FinetuneConfig
    from stages.finetune.run import MetricsFn
    from stages.policy.checkpoint import CheckpointRef

app = typer.Typer(
    name="robo-pipe",
    help=(
        "Train, simulate and deploy robot policies.\n\n"
        "State (runs, datasets, checkpoints, registry) lives under $ROBO_PIPE_HOME "
        "(default ./.robo-pipe). Configs are YAML files in configs/; override any field with "
        "--set FIELD=VALUE."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)

ConfigArg = Annotated[Path, typer.Argument(help="Pipeline config YAML, e.g. configs/demo.yaml.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a config field, FIELD=VALUE with VALUE parsed as YAML "
        "(e.g. --set sim.num_envs=32). Repeatable.",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the result record as JSON on the last line.")
]


def _fail(err: Exception) -> typer.Exit:
    for line in str(err).splitlines():
        console.print(f"[red]error:[/red] {line}", highlight=False, markup=True)
    return typer.Exit(code=2)


def _progress(label: str, fields: str, json_out: bool) -> Progress:
    """A progress bar on stderr: label, bar, done/total, verb-specific ``fields``, elapsed.

    With ``--json`` it disappears when done, leaving stdout's last line to the JSON record.
    """
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(fields),
        TimeElapsedColumn(),
        console=console,
        transient=json_out,
    )


def _load(config: Path, set_: list[str] | None, **options: object) -> PipelineConfig:
    """Load ``config`` with ``--set`` overrides, then verb options (``{"a.b": value}``; None
    means not given); a bad config exits 2 with one line per problem."""
    overrides = list(set_ or [])
    overrides += [f"{field}={value}" for field, value in options.items() if value is not None]
    try:
        return load_config(config, overrides)
    except ConfigError as err:
        raise _fail(err) from None


@app.command()
def demo(
    config: ConfigArg = Path("configs/demo.yaml"),
    set_: SetOpt = None,
    episodes: Annotated[
        int | None, typer.Option(min=1, help="Episodes to play (overrides demo.episodes).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Watch the scripted expert solve the task: success rate, filmstrip PNG, GIF, report.

    Writes into a new $ROBO_PIPE_HOME/runs/<id>-<name>/ folder: config.yaml (the resolved
    config), report.md, expert_filmstrip.png, expert_episodes.gif and result.json.
    """
    from pipelines.demo import run_demo
    from pipelines.home import new_run_dir

    cfg = _load(config, set_, **{"demo.episodes": episodes})
    run_dir = new_run_dir(cfg.name)
    successes = 0
    with _progress("expert episodes", "success {task.fields[rate]}", json_out) as progress:
        task = progress.add_task("episodes", total=cfg.demo.episodes, rate="-")

        def tick(rec: object) -> None:
            nonlocal successes
            successes += bool(getattr(rec, "success", False))
            done = int(progress.tasks[0].completed) + 1
            progress.update(task, advance=1, rate=f"{successes / done:.1%}")

        try:
            report = run_demo(cfg, run_dir, on_episode=tick)
        except (SceneError, RobotDefinitionError) as err:
            raise _fail(err) from None
    low, high = report.success_ci95
    table = Table(title=f"scripted expert on {report.variant}", show_header=False)
    table.add_row("success rate", f"{report.success_rate:.1%}  (95% CI {low:.1%} - {high:.1%})")
    table.add_row("episodes", str(report.episodes))
    table.add_row("mean episode length", f"{report.mean_episode_length:.1f} steps")
    table.add_row("throughput", f"{report.env_steps_per_s:,.0f} env-steps/s")
    table.add_row("report", report.report)
    table.add_row("filmstrip", report.filmstrip)
    console.print(table)
    if json_out:
        print(json.dumps(asdict(report)))


RayAddressOpt = Annotated[
    str | None,
    typer.Option(help="Join this Ray cluster (e.g. auto or ray://head:10001); default local."),
]


def _collect(
    cfg: PipelineConfig, target: Path, ray_address: str | None, json_out: bool
) -> DatasetRef:
    """Collect (or finish, or reuse) ``cfg``'s dataset at ``target`` with a progress bar."""
    from stages.collect import ShardResult, collect

    done = solved = frames = 0
    start = time.perf_counter()
    fields = "episodes  {task.fields[rate]} frames/s  source success {task.fields[success]}"
    with _progress("collecting", fields, json_out) as progress:
        task = progress.add_task("collect", total=cfg.collect.episodes, rate="-", success="-")

        def shard_done(result: ShardResult) -> None:
            nonlocal done, solved, frames
            done += result.attempted
            solved += result.solved
            frames += result.kept_frames
            progress.update(
                task,
                completed=done,
                rate=f"{frames / (time.perf_counter() - start):,.0f}",
                success=f"{solved / done:.1%}",
            )

        try:
            ref = collect(
                cfg.robot,
                cfg.scene,
                cfg.sim,
                cfg.collect,
                cfg.seed,
                target,
                ray_address=ray_address,
                on_shard=shard_done,
                extra_provenance={
                    "config": cfg.model_dump(mode="json"),
                    "config_hash": cfg.config_hash(),
                },
            )
        except (DatasetError, SceneError, RobotDefinitionError, RayClusterError) as err:
            raise _fail(err) from None
        progress.update(task, completed=cfg.collect.episodes)
    return ref


def _default_dataset(cfg: PipelineConfig) -> Path:
    from pipelines.home import home_dir

    return home_dir("datasets") / cfg.dataset_name()


@app.command("collect")
def collect_cmd(
    config: ConfigArg,
    set_: SetOpt = None,
    episodes: Annotated[
        int | None, typer.Option(help="Episodes to attempt (overrides collect.episodes).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Dataset directory (default $ROBO_PIPE_HOME/datasets/<name>-<variant>-<key>)."
        ),
    ] = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Collect demonstrations into a LeRobot v3 dataset (resumable, appendable).

    Re-running the same command after an interruption continues from the committed episodes
    and ends with the same dataset; a larger --episodes appends to it.
    """
    from pipelines.config import save_resolved
    from pipelines.home import new_run_dir

    cfg = _load(config, set_, **{"collect.episodes": episodes})
    run_dir = new_run_dir(f"{cfg.name}-collect")
    save_resolved(cfg, run_dir / "config.yaml")
    start = time.perf_counter()
    ref = _collect(cfg, out or _default_dataset(cfg), ray_address, json_out)
    (run_dir / "dataset_ref.json").write_text(json.dumps(ref.to_json(), indent=2))
    table = Table(title=f"dataset {ref.path}", show_header=False)
    table.add_row("episodes / frames", f"{ref.episodes} / {ref.frames}")
    table.add_row("source success", f"{ref.source_success_rate:.1%} ({ref.source})")
    table.add_row("content hash", ref.content_hash[:16])
    table.add_row("wall time", f"{time.perf_counter() - start:.1f} s")
    console.print(table)
    if json_out:
        print(json.dumps(ref.to_json()))


def _train_progress(label: str, steps: int, json_out: bool) -> tuple[Progress, MetricsFn]:
    """A progress bar over training steps showing loss and samples/s, and its metrics callback."""
    progress = _progress(label, "loss {task.fields[loss]}  {task.fields[sps]} samples/s", json_out)
    task = progress.add_task(label, total=steps, loss="-", sps="-")

    def on_metrics(record: dict[str, float]) -> None:
        progress.update(
            task,
            completed=record["step"],
            loss=f"{record['action_loss']:.4f}",
            sps=f"{record['samples_per_s']:,.0f}",
        )

    return progress, on_metrics


def _pretrain(cfg: PipelineConfig, ray_address: str | None, json_out: bool) -> CheckpointRef:
    """The base for ``cfg`` (cached after the first run), with progress."""
    from pipelines.training import pretrain_base
    from stages.policy.checkpoint import CheckpointError

    progress, on_metrics = _train_progress("pretraining", cfg.pretrain.bc.steps, json_out)
    with progress:
        try:
            return pretrain_base(
                cfg,
                ray_address,
                on_metrics=on_metrics,
                on_status=lambda line: progress.console.print(f"[dim]{line}"),
            )
        except (DatasetError, SceneError, CheckpointError, RayClusterError, ValueError) as err:
            raise _fail(err) from None


def _print_checkpoint(title: str, ref: CheckpointRef, seconds: float, json_out: bool) -> None:
    table = Table(title=title, show_header=False)
    table.add_row("checkpoint", ref.path)
    table.add_row("policy", f"{ref.policy_type}, trains {ref.trainable}, step {ref.step}")
    share = ref.trainable_params / max(1, ref.total_params)
    table.add_row(
        "parameters", f"{ref.trainable_params:,} trainable of {ref.total_params:,} ({share:.1%})"
    )
    if ref.metrics:
        table.add_row("final action loss", f"{ref.metrics.get('action_loss', float('nan')):.4f}")
        table.add_row("samples/s", f"{ref.metrics.get('samples_per_s', 0.0):,.0f}")
    if ref.base:
        table.add_row("base", f"{ref.base['kind']} {ref.base['path']}")
    table.add_row("wall time", f"{seconds:.1f} s")
    console.print(table)
    if json_out:
        print(json.dumps(ref.to_json()))


@app.command("pretrain")
def pretrain_cmd(
    config: ConfigArg,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Pretrain the base VLA on the task family (cached: runs once per setting).

    The task family is every training scene variant except the target (scene.variant), or
    pretrain.variants. Collects pretrain.episodes_per_variant demonstrations per variant, then
    trains the full default VLA with behaviour cloning on Ray Train. The base is cached under
    $ROBO_PIPE_HOME/checkpoints/base-<key>: running again with the same settings returns it at
    once, and an interrupted run resumes from its latest checkpoint.
    """
    cfg = _load(config, set_)
    start = time.perf_counter()
    ref = _pretrain(cfg, ray_address, json_out)
    _print_checkpoint("pretrained base", ref, time.perf_counter() - start, json_out)


@app.command("finetune")
def finetune_cmd(
    config: ConfigArg,
    set_: SetOpt = None,
    algo: Annotated[
        str | None,
        typer.Option(
            help="bc, ppo or sac (overrides finetune.algo). ppo/sac: RL in simulation after the "
            "BC warm start, or from the base with finetune.warm_start: none."
        ),
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            help="LeRobot v3 dataset to train on (default: the config's, collected if missing)."
        ),
    ] = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Fine-tune the policy: behaviour cloning on demonstrations, then optionally RL (PPO/SAC).

    policy.type default: freezes the pretrained base (pretrained first if missing) and trains
    LoRA adapters + heads (finetune.trainable: lora) or everything (all). policy.type hub-vlm:
    LoRA on the pretrained backbone at policy.backbone. BC runs on finetune.bc.workers Ray
    Train workers. With --algo ppo or sac, RL runs on finetune.rl.workers rollout-worker actors
    and one learner actor, syncing only the trainable weights; it writes learning_curves.png
    beside its checkpoints. An interrupted run resumes from its latest checkpoint when re-run.
    """
    from pipelines.config import save_resolved
    from pipelines.home import new_run_dir
    from pipelines.training import bc_finetune, rl_finetune_from
    from stages.policy.checkpoint import CheckpointError

    overrides = [*(set_ or []), *([f"finetune.algo={algo}"] if algo else [])]
    cfg = _load(config, overrides)
    run_dir = new_run_dir(f"{cfg.name}-finetune")
    save_resolved(cfg, run_dir / "config.yaml")
    start = time.perf_counter()
    base = _pretrain(cfg, ray_address, json_out) if cfg.policy.type == "default" else None
    rl = cfg.finetune.algo in ("ppo", "sac")
    try:
        if rl and cfg.finetune.warm_start == "none":
            if base is None:
                raise ValueError("finetune.warm_start: none needs the default VLA's base")
            ref = base
        else:
            data = dataset or _collect(cfg, _default_dataset(cfg), ray_address, json_out)
            progress, on_metrics = _train_progress("fine-tuning", cfg.finetune.bc.steps, json_out)
            with progress:
                ref = bc_finetune(cfg, data, base, ray_address, on_metrics)
        if rl:
            progress, on_metrics = _rl_progress(cfg.finetune, json_out)
            with progress:
                ref = rl_finetune_from(cfg, ref, ray_address, on_metrics)
    except (DatasetError, SceneError, CheckpointError, RayClusterError, ValueError) as err:
        raise _fail(err) from None
    (run_dir / "checkpoint_ref.json").write_text(json.dumps(ref.to_json(), indent=2))
    title = f"{cfg.finetune.algo.upper()}-fine-tuned policy" if rl else "fine-tuned policy"
    _print_checkpoint(title, ref, time.perf_counter() - start, json_out)
    if rl and not json_out:
        console.print(f"learning curves: {Path(ref.path).parent / 'learning_curves.png'}")


def _rl_progress(config: FinetuneConfig, json_out: bool) -> tuple[Progress, MetricsFn]:
    """A progress bar over RL iterations showing training-episode success and env-steps/s."""
    fields = "success {task.fields[success]}  {task.fields[sps]} env-steps/s"
    progress = _progress(f"RL ({config.algo})", fields, json_out)
    task = progress.add_task(config.algo, total=config.rl.iterations, success="-", sps="-")

    def on_metrics(record: dict[str, float]) -> None:
        success = record.get("success_rate", float("nan"))
        progress.update(
            task,
            completed=record["step"],
            success="-" if success != success else f"{success:.0%}",
            sps=f"{record['env_steps_per_s']:,.0f}",
        )

    return progress, on_metrics


def _local_policy(policy: Path) -> Path:
    """A path as given, or the downloaded export of a ``models:/`` registry version."""
    text = str(policy)
    if not text.startswith("models:"):
        return policy
    from pipelines.services import configure
    from pipelines.tracking import RegistryError, fetch_export, parse_model_uri

    configure()
    try:
        name, ref = parse_model_uri(text)
        return fetch_export(name, ref)[1]
    except RegistryError as err:
        raise _fail(err) from None


@app.command("evaluate")
def evaluate_cmd(
    policy: Annotated[
        Path,
        typer.Argument(
            help="Checkpoint directory, exported ONNX (directory or file), or a registry "
            "version: models:/<name>@<alias> or models:/<name>/<version>."
        ),
    ],
    config: Annotated[
        Path, typer.Option(help="Pipeline config: robot, scene, simulator, evaluate settings.")
    ] = Path("configs/demo.yaml"),
    set_: SetOpt = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="Evaluate this policy (path or models:/ URI) on the same seeds and gate on the "
            "difference."
        ),
    ] = None,
    episodes: Annotated[
        int | None, typer.Option(min=1, help="Episodes per variant (overrides evaluate.episodes).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Root seed of the eval seeds.")] = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate a policy in simulation: success with 95% intervals per scene variant.

    The suite is evaluate.variants (default: the held-out variants of scene.variant) x
    evaluate.episodes seeds, sharded over evaluate.workers Ray workers. With --baseline both
    run on the same seeds and the gate fails only if the policy is worse at
    evaluate.gate_confidence. Writes report.md, success.png, frame strips and
    eval_report.json into a new $ROBO_PIPE_HOME/runs/ folder.
    """
    from pipelines.config import save_resolved
    from pipelines.home import new_run_dir
    from stages.evaluate.policies import PolicySpecError
    from stages.evaluate.run import ShardOutcome, suite_variants
    from stages.evaluate.stage import evaluate

    cfg = _load(config, set_, **{"evaluate.episodes": episodes, "seed": seed})
    policy = _local_policy(policy)
    baseline = _local_policy(baseline) if baseline is not None else None
    run_dir = new_run_dir(f"{cfg.name}-evaluate")
    save_resolved(cfg, run_dir / "config.yaml")
    variants = suite_variants(cfg.scene, cfg.evaluate)
    total = len(variants) * cfg.evaluate.episodes * (2 if baseline else 1)
    done = wins = steps = 0
    start = time.perf_counter()
    fields = "success {task.fields[rate]}  {task.fields[sps]} env-steps/s"
    with _progress("evaluating", fields, json_out) as progress:
        task = progress.add_task("evaluate", total=total, rate="-", sps="-")

        def shard_done(outcome: ShardOutcome) -> None:
            nonlocal done, wins, steps
            done += len(outcome.episodes)
            wins += sum(e.success for e in outcome.episodes)
            steps += sum(e.length for e in outcome.episodes)
            progress.update(
                task,
                completed=done,
                rate=f"{wins / done:.1%}",
                sps=f"{steps / (time.perf_counter() - start):,.0f}",
            )

        try:
            report = evaluate(
                policy,
                cfg.robot,
                cfg.scene,
                cfg.sim,
                cfg.evaluate,
                cfg.seed,
                run_dir,
                baseline=baseline,
                ray_address=ray_address,
                on_shard=shard_done,
            )
        except (PolicySpecError, SceneError, RayClusterError, ValueError) as err:
            raise _fail(err) from None
    table = Table(title=f"evaluation of {policy}")
    for col in ("variant", "episodes", "success", "95% CI", "mean length"):
        table.add_column(col)
    for r in report.rows:
        ci = f"{r.ci95[0]:.1%} - {r.ci95[1]:.1%}"
        table.add_row(
            r.variant, str(r.episodes), f"{r.success_rate:.1%}", ci, f"{r.mean_length:.1f}"
        )
    ci = f"{report.ci95[0]:.1%} - {report.ci95[1]:.1%}"
    table.add_row("all", str(report.episodes), f"{report.success_rate:.1%}", ci, "")
    console.print(table)
    if report.comparison:
        c = report.comparison
        verdict = "[green]passed" if c.passed else "[red]FAILED"
        console.print(
            f"gate vs {c.baseline}: {verdict}[/] (baseline {c.baseline_success_rate:.1%}, "
            f"difference {c.difference:+.1%}, one-sided p = {c.p_value:.4f})"
        )
    console.print(
        f"{report.env_steps_per_s:,.0f} env-steps/s, {report.episodes_per_s:.1f} episodes/s; "
        f"report: {report.report}"
    )
    if json_out:
        print(json.dumps(report.to_json()))


@app.command("export")
def export_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory (policy.json inside).")],
    out: Annotated[
        Path | None, typer.Option(help="Export directory (default: <checkpoint>-export).")
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(help="Also check parity on real frames of this LeRobot dataset."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Export a checkpoint to ONNX: policy.onnx, io_spec.json, tokenizer, parity reference.

    Normalisation and LoRA are inside the graph (dynamo exporter, opset 18, dynamic batch), so
    the file runs without the training code. Parity against torch on random inputs (and dataset
    frames with --dataset) must be within 1e-4 or the export is refused.
    """
    from stages.export.onnx import ExportError, export_policy
    from stages.policy.checkpoint import CheckpointError

    target = out or checkpoint.with_name(f"{checkpoint.name}-export")
    start = time.perf_counter()
    try:
        ref = export_policy(checkpoint, target, dataset=dataset)
    except (CheckpointError, DatasetError, ExportError) as err:
        raise _fail(err) from None
    table = Table(title=f"exported {checkpoint}", show_header=False)
    table.add_row("ONNX", f"{ref.onnx} (opset {ref.opset})")
    table.add_row("hash", ref.onnx_hash[:16])
    parity = ", ".join(f"{k} {v:.1e}" for k, v in ref.parity.items())
    table.add_row("parity |ORT - torch|", parity)
    table.add_row("wall time", f"{time.perf_counter() - start:.1f} s")
    console.print(table)
    if json_out:
        print(json.dumps(ref.to_json()))


@app.command("gate")
def gate_cmd(
    export_dir: Annotated[Path, typer.Argument(help="Export directory (robo-pipe export).")],
    target: Annotated[
        str, typer.Option(help="Target profile: a name in configs/targets/ or a YAML path.")
    ] = "local-cpu",
    budget_ms: Annotated[
        float | None, typer.Option(help="p99 budget in ms (default: the profile's).")
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Measured control steps.")] = 1000,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured steps first.")] = 50,
    pace: Annotated[
        bool, typer.Option(help="Sleep to the control rate between steps, as on the robot.")
    ] = True,
    config: Annotated[Path, typer.Option(help="Pipeline config (robot, scene).")] = Path(
        "configs/demo.yaml"
    ),
    json_out: JsonOpt = False,
) -> None:
    """Latency gate: the whole control step on this machine, p99 against the budget.

    Runs the export on the target profile's engine in the control loop (the simulated robot
    stands in for the arm), times observation in -> action out for --steps steps after warm-up,
    and passes only if p99 <= budget and deadline misses <= the profile's allowance. Writes
    latency.md, latency.png and latency_report.json into a new run folder.
    """
    from deploy_edge.engines import EngineError, EngineUnavailable
    from deploy_edge.exported import IOSpecError
    from deploy_edge.latency import load_target, run_gate
    from pipelines.gate import gate_robot
    from pipelines.home import new_run_dir

    cfg = _load(config, None)
    try:
        profile = load_target(target)
        robot, instruction = gate_robot(cfg, export_dir)
        run_dir = new_run_dir(f"{cfg.name}-gate")
        with console.status(f"measuring {steps} control steps on {profile.name}"):
            report = run_gate(
                export_dir, robot, instruction, profile, steps, warmup, budget_ms, pace, run_dir
            )
    except (OSError, ValueError, IOSpecError, EngineError, EngineUnavailable) as err:
        raise _fail(err) from None
    verdict = "[green]PASSED" if report.passed else "[red]FAILED: " + "; ".join(report.reasons)
    console.print(f"latency gate on {report.target}: {verdict}[/]")
    console.print(
        f"p50 {report.p50_ms:.2f}  p95 {report.p95_ms:.2f}  p99 {report.p99_ms:.2f}  "
        f"max {report.max_ms:.2f} ms (budget {report.budget_ms:g}); jitter "
        f"{report.jitter_ms:.2f} ms; misses {report.misses}; {report.measured_on['engine']}; "
        f"report: {report.report}"
    )
    if json_out:
        print(json.dumps(report.to_json()))
    if not report.passed:
        raise typer.Exit(code=1)


# -- the pipeline --------------------------------------------------------------------------------


def _services() -> Services:
    """Configure Prefect/MLflow for this home and check the configured servers answer."""
    from pipelines.services import (
        ServiceError,
        check_services,
        configure,
        refresh_prefect_settings,
    )

    services = configure()
    refresh_prefect_settings()  # loading the config may have imported Prefect already
    try:
        check_services(services)
    except ServiceError as err:
        raise _fail(err) from None
    return services


def _quiet_prefect_console() -> None:
    """Keep Prefect's own log (and a failed flow's traceback) off the terminal: our verbs say
    what happened; the log stays in the Prefect UI. Set before Prefect configures logging."""
    import os

    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")


class _StageDisplay:
    """Live per-stage progress of a pipeline run in this process (one row per stage)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.rows: dict[str, TaskID] = {}

    def _row(self, stage: str, total: float | None) -> TaskID:
        if stage not in self.rows:
            self.rows[stage] = self.progress.add_task(stage, total=total, detail="", unit="")
        return self.rows[stage]

    def started(self, stage: str, total: float | None, unit: str) -> None:
        row = self._row(stage, total)
        self.progress.update(row, total=total, unit=unit)
        self.progress.start_task(row)

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        row = self._row(stage, None)
        if completed:
            self.progress.update(row, completed=completed, detail=detail)
        else:
            self.progress.update(row, detail=detail)

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        row = self._row(stage, 1)
        total = self.progress.tasks[row].total or 1
        note = " (reused from an earlier run)" if reused else ""
        self.progress.update(row, total=total, completed=total, detail=f"[green]{detail}{note}")


def _pipeline_progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:>9}"),
        BarColumn(bar_width=30),
        TextColumn(
            "{task.completed:>6.0f}/{task.total:<6.0f}" if False else "{task.percentage:>3.0f}%"
        ),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
    )


@app.command("run")
def run_cmd(
    config: ConfigArg,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also print Prefect's flow and task logs.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run the whole pipeline: collect, pretrain (cached), fine-tune, export, evaluate the export,
    latency gate, register in MLflow; champion moves only if every gate passes.

    Each stage is a Prefect task (see them in `robo-pipe ui`); everything is logged to one MLflow
    run. Re-running after a failure or Ctrl-C reuses the completed stages and continues from the
    one that did not finish. Ends with the registered version, its gates, and where to look.
    """

    cfg = _load(config, set_)  # a bad config stops here, before anything starts
    if not verbose:
        _quiet_prefect_console()
    services = _services()
    if ray_address:
        from stages.ray_runtime import init_ray

        try:
            init_ray(ray_address)
        except RayClusterError as err:
            raise _fail(err) from None
    console.print(
        f"pipeline [bold]{cfg.name}[/] (config hash {cfg.config_hash()}): Prefect "
        f"{services.prefect_api_url or 'temporary local server (robo-pipe ui shows its runs)'}, "
        f"MLflow {services.mlflow_tracking_uri}",
        highlight=False,
    )
    from pipelines.flow import listening, train_simulate_deploy

    start = time.perf_counter()
    progress = _pipeline_progress()
    try:
        with progress, listening(_StageDisplay(progress)):
            result = train_simulate_deploy(
                config=str(config), overrides=list(set_ or []), ray_address=ray_address
            )
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: run the same command again to resume")
        raise typer.Exit(code=130) from None
    except Exception as err:  # the flow failed: say where, and how to resume
        console.print(f"[red]pipeline failed:[/] {type(err).__name__}: {err}", highlight=False)
        console.print(
            "completed stages are kept: run the same command again to resume "
            "(--verbose shows the full log)"
        )
        raise typer.Exit(code=1) from None
    _print_result(result, time.perf_counter() - start)
    if json_out:
        print(json.dumps(result))


def _print_result(result: dict[str, Any], seconds: float) -> None:
    table = Table(title=f"gates for {result['model_name']} v{result['version']}")
    for col in ("gate", "result", "measured", "required"):
        table.add_column(col)
    for name, gate in result["gates"].items():
        verdict = "[green]pass" if gate["passed"] else "[red]FAIL"
        if not gate["enforced"]:
            verdict += " (not enforced)"
        table.add_row(name, verdict, gate["measured"], gate["required"])
    console.print(table)
    uri = f"models:/{result['model_name']}/{result['version']}"
    if result["promoted"]:
        console.print(
            f"[green]registered {uri}: champion[/] (aliases {', '.join(result['aliases'])})"
        )
    else:
        console.print(
            f"[yellow]registered {uri} as candidate; champion unchanged[/] "
            f"(failed: {', '.join(result['blocked_by'])})"
        )
    if result["start_success_rate"] is not None:
        console.print(
            f"held-out success {result['success_rate']:.1%} "
            f"(95% CI {result['ci95'][0]:.1%} - {result['ci95'][1]:.1%}); the model it started "
            f"from: {result['start_success_rate']:.1%}"
        )
    console.print(f"pipeline took {seconds / 60:.1f} min; summary: {result['run_dir']}/summary.md")
    for label, url in result["links"].items():
        console.print(f"  {label}: {url}", highlight=False)
    console.print("  (the UIs answer while `robo-pipe ui` runs)", style="dim")


@app.command("serve")
def serve_cmd(
    config: ConfigArg,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
) -> None:
    """Register the config's schedules as Prefect deployments and run their flow runs until
    Ctrl-C or SIGTERM.

    schedules: in the config lists them, e.g. a nightly train_simulate_deploy on cron
    "0 2 * * *" in Europe/Berlin and an hourly champion_regression. Scheduled runs and runs
    started from the Prefect UI or API execute here, one per deployment at a time. Without
    PREFECT_API_URL or a running `robo-pipe ui`, a local Prefect server and MLflow UI are
    started for as long as this runs (a schedule needs a server's scheduler), and stopped
    with it.
    """
    from pipelines.services import LocalServers, ServiceError, sigterm_as_ctrl_c, use_prefect_api

    cfg = _load(config, set_)
    if not cfg.schedules:
        raise _fail(ConfigError([f"{config}: field 'schedules' is empty: nothing to serve"]))
    sigterm_as_ctrl_c()
    services = _services()
    servers = None
    start = time.perf_counter()
    try:
        if services.prefect_api_url is None:
            servers = LocalServers()
            with console.status("starting the Prefect server and the MLflow UI"):
                try:
                    servers.start()
                except ServiceError as err:
                    raise _fail(err) from None
            use_prefect_api(f"{servers.prefect_url}/api")
            console.print(
                f"Prefect UI {servers.prefect_url}   MLflow UI {servers.mlflow_url}",
                highlight=False,
            )
        else:
            console.print(f"Prefect API {services.prefect_api_url}", highlight=False)
        from pipelines.deployments import OVERLAP, build_deployments, describe_schedule, serve

        deployments = build_deployments(cfg, config, list(set_ or []), ray_address)
        for entry in cfg.schedules:
            overlap = "waits" if OVERLAP[entry.flow] == "ENQUEUE" else "is skipped"
            console.print(
                f"serving {entry.flow}/{entry.name} {describe_schedule(entry)} "
                f"(a run that starts while one runs {overlap})",
                highlight=False,
            )
        prefect_ui = servers.prefect_url if servers else services.prefect_ui
        console.print(
            f"next runs: {prefect_ui}/deployments (each one's Upcoming tab); Ctrl-C stops serving",
            style="dim",
            highlight=False,
        )
        serve(deployments)
    except KeyboardInterrupt:
        pass
    finally:
        stopping = time.perf_counter()
        if servers:
            servers.stop()
        console.print(
            f"stopped after {stopping - start:.0f} s (shutdown took "
            f"{time.perf_counter() - stopping:.1f} s)"
        )


@app.command("ui")
def ui_cmd(
    prefect_port: Annotated[
        int, typer.Option(help="Prefect server port (next free if taken).")
    ] = 4200,
    mlflow_port: Annotated[int, typer.Option(help="MLflow UI port (next free if taken).")] = 5000,
) -> None:
    """Start the local Prefect server and the MLflow UI on 127.0.0.1 and print their URLs.

    Both show this home's runs (earlier ones too). While this runs, `robo-pipe run` reports to
    this Prefect server, so its stages appear live. Ctrl-C or SIGTERM stops both.
    """
    from pipelines.services import LocalServers, ServiceError, sigterm_as_ctrl_c

    sigterm_as_ctrl_c()
    servers = LocalServers(prefect_port, mlflow_port)
    try:
        with console.status("starting the Prefect server and the MLflow UI"):
            try:
                servers.start()
            except ServiceError as err:
                raise _fail(err) from None
        console.print(f"Prefect UI  {servers.prefect_url}", highlight=False)
        console.print(f"MLflow UI   {servers.mlflow_url}", highlight=False)
        console.print("Ctrl-C stops both", style="dim")
        while all(p.poll() is None for p in servers.processes):
            time.sleep(1)
        console.print("[red]a server exited[/]; see the logs under $ROBO_PIPE_HOME")
    except KeyboardInterrupt:
        pass
    finally:
        servers.stop()


@app.command("info")
def info_cmd(json_out: JsonOpt = False) -> None:
    """Print the home, the MLflow tracking URI and the Prefect API URL this machine uses."""
    from pipelines.services import configure

    services = configure()
    table = Table(show_header=False, title="robo-pipe")
    table.add_row("home ($ROBO_PIPE_HOME)", services.home)
    table.add_row("MLflow tracking URI", services.mlflow_tracking_uri)
    table.add_row("MLflow UI", services.mlflow_ui or "not running (robo-pipe ui)")
    table.add_row(
        "Prefect API",
        services.prefect_api_url or "temporary local server per run (no PREFECT_API_URL)",
    )
    table.add_row("Prefect UI", services.prefect_ui or "not running (robo-pipe ui)")
    table.add_row("Prefect home", services.prefect_home)
    console.print(table)
    if json_out:
        print(json.dumps(services.to_json()))


models_app = typer.Typer(
    help="The MLflow model registry: list, show, promote and roll back policy versions.",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")


def _registry() -> Any:
    from pipelines import tracking

    _services()
    return tracking


@models_app.command("list")
def models_list(json_out: JsonOpt = False) -> None:
    """Registered models with their versions and aliases."""
    tracking = _registry()
    records = []
    table = Table(title="registered models")
    for col in ("model", "versions", "champion", "candidate", "latest"):
        table.add_column(col)
    for name in tracking.model_names():
        versions = tracking.versions(name)
        by_alias = {a: v.version for v in versions for a in v.aliases}
        table.add_row(
            name,
            str(len(versions)),
            by_alias.get("champion", "-"),
            by_alias.get("candidate", "-"),
            versions[0].version if versions else "-",
        )
        records.append({"name": name, "versions": [v.to_json() for v in versions]})
    console.print(table)
    if json_out:
        print(json.dumps(records))


@models_app.command("show")
def models_show(
    model: Annotated[str, typer.Argument(help="NAME, NAME@ALIAS or NAME/VERSION.")],
    json_out: JsonOpt = False,
) -> None:
    """A model's versions, or one version's lineage and gate results."""
    tracking = _registry()
    try:
        if "@" in model or "/" in model:
            name, ref = tracking.parse_model_uri(model)
            shown = [tracking.get_version(name, ref)]
        else:
            shown = tracking.versions(model)
    except tracking.RegistryError as err:
        raise _fail(err) from None
    for v in shown:
        table = Table(title=f"{v.name} v{v.version} {' '.join(v.aliases)}", show_header=False)
        table.add_row("registered", v.created)
        table.add_row("source", v.source)
        for key, value in sorted(v.tags.items()):
            table.add_row(key.removeprefix(tracking.TAG), value)
        console.print(table)
    if json_out:
        print(json.dumps([v.to_json() for v in shown]))


@models_app.command("promote")
def models_promote(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[str, typer.Argument(help="Version number (or alias) to make champion.")],
    force: Annotated[
        bool, typer.Option(help="Promote even if the version failed a gate (recorded in its tags).")
    ] = False,
) -> None:
    """Make a version the champion. Refused if it failed a gate, unless --force."""
    tracking = _registry()
    try:
        info = tracking.get_version(model, version)
        failed = tracking.failed_gates(info)
        if failed and not force:
            raise tracking.RegistryError(
                f"{model} v{info.version} failed gates: {', '.join(failed)}; "
                "--force to promote anyway"
            )
        reason = "robo-pipe models promote" + (
            f" --force (failed {', '.join(failed)})" if failed else ""
        )
        info = tracking.promote(model, info.version, reason)
    except tracking.RegistryError as err:
        raise _fail(err) from None
    console.print(f"{model} v{info.version} is champion", highlight=False)


@models_app.command("rollback")
def models_rollback(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
) -> None:
    """Give the champion alias back to the previous champion."""
    tracking = _registry()
    try:
        info = tracking.rollback(model)
    except tracking.RegistryError as err:
        raise _fail(err) from None
    console.print(f"{model}: champion rolled back to v{info.version}", highlight=False)


@models_app.command("check")
def models_check(
    config: ConfigArg,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate the config's champion on its held-out suite (the champion_regression flow, as
    the hourly schedule runs it). Exits 1 if it fell below registry.promotion.min_success."""
    cfg = _load(config, set_)
    _quiet_prefect_console()
    tracking = _registry()
    if tracking.champion(cfg.model_name) is None:
        raise _fail(tracking.RegistryError(f"{cfg.model_name} has no champion to check"))
    from pipelines.flow import RegressionDetected, champion_regression

    try:
        result = champion_regression(
            config=str(config), overrides=list(set_ or []), ray_address=ray_address
        )
    except RegressionDetected as err:
        console.print(f"[red]regression:[/] {err}", highlight=False)
        raise typer.Exit(code=1) from None
    console.print(
        f"[green]champion {result['model_name']} v{result['version']} holds[/]: held-out "
        f"success {result['success_rate']:.1%} (95% CI {result['ci95'][0]:.1%} - "
        f"{result['ci95'][1]:.1%}), required {cfg.registry.promotion.min_success:.0%}",
        highlight=False,
    )
    if json_out:
        print(json.dumps(result))


@app.command("config")
def show_config(config: ConfigArg, set_: SetOpt = None) -> None:
    """Validate a config and print it fully resolved (extends and --set applied) as YAML."""
    import yaml

    cfg = _load(config, set_)
    print(f"# config hash {cfg.config_hash()}")
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")


@app.command("robots")
def list_robots(json_out: JsonOpt = False) -> None:
    """List robots with their joints and limits, cameras, control rate and action space."""
    records = []
    for name in available_robots():
        spec = get_robot(name)
        table = Table(title=f"{name}: {spec.definition.description}")
        table.add_column("action component")
        table.add_column("range")
        table.add_column("unit")
        for comp, low, high, unit in zip(
            spec.action.names, spec.action.low, spec.action.high, spec.action.units, strict=True
        ):
            table.add_row(comp, f"[{low:g}, {high:g}]", unit)
        console.print(table)
        joints = ", ".join(f"{j.name} [{j.low:g}, {j.high:g}]" for j in spec.arm + spec.gripper)
        console.print(f"  joints: {joints}", highlight=False)
        console.print(
            f"  control: {spec.control_hz:g} Hz ({spec.substeps} physics steps); cameras: "
            f"{', '.join(c.name for c in spec.cameras)}; state: {', '.join(spec.state_names)}",
            highlight=False,
        )
        records.append(
            {
                "name": name,
                "control_hz": spec.control_hz,
                "cameras": [c.name for c in spec.cameras],
                "action": asdict(spec.action),
                "state": list(spec.state_names),
            }
        )
    if json_out:
        print(json.dumps(records))


@app.command("scenes")
def list_scenes(json_out: JsonOpt = False) -> None:
    """List the task's scene variants; held-out ones are reserved for evaluation."""
    table = Table(title="touch task scene variants")
    for col in ("variant", "split", "objects", "colours", "shapes", "description"):
        table.add_column(col)
    for v in VARIANTS.values():
        split = v.split if v.holdout_for is None else f"{v.split} (for {v.holdout_for})"
        table.add_row(
            v.name,
            split,
            f"{v.num_objects[0]}-{v.num_objects[1]}",
            ", ".join(v.colours),
            ", ".join(v.shapes),
            v.description,
        )
    console.print(table)
    if json_out:
        print(json.dumps([{"name": v.name, "split": v.split} for v in VARIANTS.values()]))


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
