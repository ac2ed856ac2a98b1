"""The verbs on exports: ``export`` (a checkpoint to ONNX, with its parity check and precision
variants) and ``gate`` (an export's control step timed against the target's latency budget).
Each checks its inputs, runs its step on a live display, and shows the record (on stdout; with
``--json`` only the record is there)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pipelines.cli.common import emit_json, load, read_registry, result_console
from pipelines.cli.display import live
from pipelines.cli.options import (
    DEMO_CONFIG,
    ConfigOpt,
    JsonOpt,
    SetOpt,
    add_verb,
    policy_argument,
)
from pipelines.cli.result_tables import show_latency, show_sweep, show_trials
from pipelines.home import new_run_dir
from pipelines.registry.versions import RegistryError
from pipelines.steps import checks
from pipelines.steps.export import export_checkpoint
from pipelines.steps.latency import measure_latency, sweep_delays
from robo_pipe.locks import set_run_label


def export(
    checkpoint: Annotated[
        str,
        policy_argument(
            ("checkpoint",),
            "An export or a registry version is exported already: gate, evaluate and deploy "
            "take it as it is.",
            "CHECKPOINT",
        ),
    ],
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

    Normalisation and LoRA are inside the graph (traced, opset 18, dynamic batch), so
    the file runs without the training code. Parity against torch on random inputs (and dataset
    frames with --dataset) must be within 1e-4 or the export is refused. With --dataset, the
    config's export.variants (default int8: policy.int8.onnx, static INT8 Q/DQ) are calibrated
    on frames of some episodes and scored against FP32 on frames of the others; one past
    export.max_relative_error is kept but marked not a candidate.
    """
    source = checks.resolve_policy(checkpoint, "export", ("checkpoint",)).path()
    cfg = load(config, set_)
    target = out or source.with_name(f"{source.name}-export")
    checks.check_checkpoint(source)
    checks.check_out_dir(target, "--out")
    if dataset is not None:
        checks.check_dataset(dataset)
    set_run_label("robo-pipe export")  # it keeps no run folder
    start = time.perf_counter()
    with live(json_out) as display:
        ref = display.step(
            "export", lambda show: export_checkpoint(cfg, source, target, dataset, show)
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
    policy: Annotated[
        str,
        policy_argument(
            ("registry", "export"),
            "A checkpoint is refused (exit 2): gate times the exported graph, so export it "
            "first (robo-pipe export CHECKPOINT).",
        ),
    ],
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
    sweep: Annotated[
        bool,
        typer.Option(
            help="Then play the evaluation suite (the config's evaluate section) at inference "
            "delays of 0-16 control ticks, sync and async, on the same seeds: success with "
            "intervals, the delay of the measured p99 marked (delay_sweep.md and .png).",
        ),
    ] = False,
    episodes: Annotated[
        int | None,
        typer.Option(min=1, help="--sweep: episodes per variant (overrides evaluate.episodes)."),
    ] = None,
    config: ConfigOpt = DEMO_CONFIG,
    json_out: JsonOpt = False,
) -> None:
    """Latency gate: the whole control step on this machine, p99 against the budget.

    POLICY is an export or a registry version (its export, downloaded into the home once).

    Runs the export on the target profile's engine in the control loop (the simulated robot
    stands in for the arm), times observation in -> action out for --steps steps after warm-up,
    and passes only if p99 <= budget and deadline misses <= the profile's allowance. Writes
    latency.md, latency.png and latency_report.json into a new run folder. Exits 1 if it fails.

    A profile with ``precision: auto`` (e.g. --target local-cpu-auto) gates the FP32 model and
    every candidate precision variant of the export, and passes with the most accurate one
    within the budget, as a device's agent chooses; the table says why the others were not.
    """
    from deploy_edge.targets import load_target

    gate_settings = {
        "latency.target": target,
        "latency.budget_ms": budget_ms,
        "latency.steps": steps_,
        "latency.warmup": warmup,
        "latency.pace": pace,
        "evaluate.episodes": episodes,
        "latency.sweep": sweep or None,  # the config's, unless --sweep
    }
    cfg = load(config, None, **gate_settings)
    if episodes is not None and not cfg.latency.sweep:  # the config's latency.sweep, or --sweep
        raise typer.BadParameter("plays only with --sweep", param_hint="--episodes")
    load_target(cfg.latency.target)
    given = checks.resolve_policy(policy, "gate", ("registry", "export"))
    if given.kind == "registry" and (missing := read_registry()):
        raise RegistryError(f"{policy}: {missing}")
    export_dir = given.path()
    checks.check_export(export_dir)
    run_dir = new_run_dir(f"{cfg.name}-gate")
    with live(json_out) as display:
        report = display.step(
            "latency", lambda show: measure_latency(cfg, export_dir, run_dir, show)
        )
        p99 = report.inference_ms
        swept = (
            display.step(
                "delay sweep",
                lambda show: sweep_delays(cfg, export_dir, run_dir, p99, show, name=policy),
            )
            if cfg.latency.sweep
            else None
        )
    out = result_console(json_out)
    show_latency(report, out)
    if report.trials:
        title = f"precision: auto on {report.target}, budget {report.budget_ms:g} ms"
        show_trials(title, report.trials, report.choice, out)
    if swept is not None:
        show_sweep(swept, run_dir, out)
    emit_json({**report.to_json(), "delay_sweep": swept.to_json()} if swept else report, json_out)
    if not report.passed:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        app,
        export,
        "robo-pipe export path/to/checkpoint --out my-export",
        "robo-pipe export path/to/checkpoint --dataset path/to/dataset --json",
    )
    add_verb(
        app,
        gate,
        "robo-pipe gate models:/demo-policy@champion",
        "robo-pipe gate my-export",
        "robo-pipe gate my-export --target jetson-orin-nano --budget-ms 20",
        "robo-pipe gate models:/demo-policy@champion --sweep",
    )
