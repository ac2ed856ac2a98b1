"""The verb that judges a policy in simulation: ``evaluate`` (success per scene variant with
95% intervals, gated against a baseline or against itself at zero inference delay). It checks
its inputs, runs its step on a live display, and shows the report (on stdout; with ``--json``
only the record is there)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.common import console, emit_json, load, read_registry, result_console
from pipelines.cli.display import live
from pipelines.cli.options import (
    DEMO_CONFIG,
    ConfigOpt,
    JsonOpt,
    RayAddressOpt,
    SetOpt,
    add_verb,
    policy_argument,
)
from pipelines.cli.result_tables import show_evaluation
from pipelines.config import save_resolved
from pipelines.home import new_run_dir
from pipelines.registry.versions import RegistryError
from pipelines.services.settings import join_cluster
from pipelines.steps import checks
from pipelines.steps.evaluate import evaluate_policy

ANY_POLICY: tuple[checks.PolicyKind, ...] = ("registry", "export", "checkpoint")
"""evaluate plays any policy: a checkpoint in torch, an export in ONNX Runtime."""


def evaluate(
    policy: Annotated[str, policy_argument(ANY_POLICY)],
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Evaluate this policy (a registry version, an export or a checkpoint, as "
            "POLICY) on the same seeds and gate on the difference: exit 1 if the policy is "
            "worse."
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
            metavar="trained|unseen|unseen-template|unseen-colour|unseen-shape|nonce|absent|shuffled",
            help="Word the instructions as the training data does (trained) or with templates "
            "and colour and shape synonyms no training instruction contains (unseen), on the "
            "same scenes; unseen-template, unseen-colour and unseen-shape change only that part; "
            "nonce (pseudowords for colour and shape), absent (a colour and shape on no object) "
            "and shuffled (the trained words reordered) are controls, compared with chance "
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
    given = [checks.resolve_policy(p, "evaluate", ANY_POLICY) for p in (policy, baseline) if p]
    registered = [g for g in given if g.kind == "registry"]
    if registered and (missing := read_registry()):
        raise RegistryError(f"{registered[0].given}: {missing}")
    candidate = given[0].path()
    against = given[1].path() if baseline else None
    for path in filter(None, (candidate, against)):
        checks.check_policy(cfg, path)
    checks.check_simulator(cfg)
    join_cluster(ray_address)
    run_dir = new_run_dir(f"{cfg.name}-evaluate")
    save_resolved(cfg, run_dir / "config.yaml")
    stored: dict[str, str] = {}
    if baseline and given[1].kind == "registry":  # a registered baseline's stored outcomes
        from pipelines.registry import champion

        stored = champion.stored_outcomes(cfg, given[1].version())
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


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        app,
        evaluate,
        "robo-pipe evaluate models:/demo-policy@champion",
        "robo-pipe evaluate models:/demo-policy/3 --baseline models:/demo-policy@champion",
        "robo-pipe evaluate runs/ckpt-export --config configs/tiny.yaml --episodes 10",
        "robo-pipe evaluate runs/ckpt-export --delay-ms 300 --delay-mode async",
    )
