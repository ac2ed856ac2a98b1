"""RL fine-tuning: does RL raise a behaviour-cloned VLA's success where BC falls short, and is
the learner the bottleneck?

1. The start: the config's BC fine-tune (default ``configs/rl-demo.yaml``: 150 demonstrations
   of touching at a 3.5 cm tolerance, where BC's failures are near misses), or ``--start``.
2. Throughput at the RL config's rollout settings (2 rollout workers x 16 environments; PPO:
   32 decisions per environment, 2 epochs, minibatches of 256): env-steps/s, updates/s and the
   share of wall time in rollout, learning and weight sync, per algorithm. PPO also runs with
   ``learner_threads=1``, the learner as it was before it took the idle cores, as the baseline
   measured in the same run.
3. Learning: each algorithm for ``--minutes`` of wall time from the same start (2 rollout
   workers and the learner on this machine's cores), then the start and every result on the
   held-out suite (the evaluate stage's variants and seeds, never trained on; the same seeds for
   every arm): success with 95% Wilson intervals, the gain over the start, whether the
   intervals overlap, and the failure breakdown (wrong object / near miss / timeout) before
   and after. Learning curves are saved as ``learning_curves.png`` beside each run.

Run: ``python benchmarks/rl_finetune.py [--minutes 12] [--algos ppo grpo sac]`` (about
``len(algos) x (minutes + 3)`` minutes once the base is cached); ``--quick`` runs a few-minute
smoke version of every part. The last line is ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from pipelines.config import CONFIG_DIR, PipelineConfig, load_config
from pipelines.home import home_dir
from pipelines.steps.collect import collect_dataset
from pipelines.steps.training import finetune_policy, pretrain_base, rl_finetune_from
from stages.evaluate import evaluate
from stages.evaluate.report import EvalReport
from stages.finetune import FinetuneConfig
from stages.finetune.checkpoints import read_metrics
from stages.policy.checkpoint import CheckpointRef, checkpoint_hash, read_policy_meta
from stages.policy.types import BaseRef

THROUGHPUT_ITERATIONS = 6
ALGOS = ("ppo", "grpo", "sac")


def bc_start(cfg: PipelineConfig) -> CheckpointRef:
    """The config's BC fine-tune (its base pretrained and its demonstrations collected first;
    every part cached)."""
    bc = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"algo": "bc"})})
    base = pretrain_base(bc)
    return finetune_policy(bc, collect_dataset(bc), base)


def ref_of(path: Path) -> CheckpointRef:
    meta = read_policy_meta(path)
    return CheckpointRef(
        path=str(path),
        content_hash=checkpoint_hash(path),
        policy_type=meta["type"],
        trainable=meta["trainable"],
        step=int(meta["lineage"].get("step", 0)),
        trainable_params=0,
        total_params=0,
        base=BaseRef.from_json(meta["base"]) if meta["base"] else None,
    )


def rl_config(cfg: PipelineConfig, algo: str, **rl: Any) -> FinetuneConfig:
    return cfg.finetune.model_copy(
        update={"algo": algo, "rl": cfg.finetune.rl.model_copy(update=rl)}
    )


def time_shares(records: list[dict[str, Any]]) -> dict[str, float]:
    """env-steps/s, updates/s and the shares of wall time in rollout, learning and sync, over
    the iteration records after the first (which includes starting the actors)."""
    rest = records[1:] or records
    env_steps = records[-1]["env_steps"] - (records[0]["env_steps"] if records[1:] else 0)
    wall = sum(r["rollout_s"] + r["learn_s"] + r["sync_s"] for r in rest)
    return {
        "env_steps_per_s": env_steps / wall,
        "updates_per_s": sum(r.get("updates", 0.0) for r in rest) / wall,
        **{part: sum(r[f"{part}_s"] for r in rest) / wall for part in ("rollout", "learn", "sync")},
    }


def throughput(
    cfg: PipelineConfig, start: CheckpointRef, algos: list[str], quick: bool
) -> list[dict[str, Any]]:
    """A few iterations of each algorithm (and PPO with one learner thread): where time goes."""
    rows = []
    runs = [(algo, None) for algo in algos] + ([("ppo", 1)] if "ppo" in algos else [])
    with tempfile.TemporaryDirectory() as tmp:
        for algo, threads in runs:
            iterations = 3 if quick else THROUGHPUT_ITERATIONS
            sac = cfg.finetune.rl.sac.model_copy(update={"learning_starts": 256})
            short = rl_config(
                cfg,
                algo,
                iterations=iterations,
                time_budget_s=None,
                learner_threads=threads,
                sac=sac,
            )
            label = f"{algo}-threads{threads or 'all'}"
            ref = rl_finetune_from(
                cfg.model_copy(update={"finetune": short, "name": label}),
                start,
                checkpoints=Path(tmp),
            )
            records = read_metrics(Path(ref.path).parent)
            rows.append({"algo": algo, "learner_threads": threads or "all", **time_shares(records)})
    return rows


def held_out(cfg: PipelineConfig, policy: str, out: Path) -> EvalReport:
    return evaluate(policy, cfg.robot, cfg.scene, cfg.sim, cfg.evaluate, cfg.seed, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG_DIR / "rl-demo.yaml")
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    parser.add_argument("--minutes", type=float, default=12.0, help="RL wall time per algorithm")
    parser.add_argument("--start", type=Path, help="start from this checkpoint instead of BC")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--quick", action="store_true", help="a few-minute smoke version")
    args = parser.parse_args()
    sets = list(args.sets)
    if args.quick:  # its own small dataset and BC start (name), the base is shared
        sets += [
            "name=rl-bench-quick",
            "evaluate.episodes=10",
            "collect.episodes=40",
            "finetune.bc.steps=60",
        ]
        args.minutes = 0.5
    cfg = load_config(args.config, sets)
    start = ref_of(args.start) if args.start else bc_start(cfg)
    print(f"start: {start.path}")

    rows = [] if args.skip_throughput else throughput(cfg, start, args.algos, args.quick)

    out = home_dir("runs") / f"rl-bench-{time.strftime('%Y%m%dT%H%M%S')}"
    out.mkdir(parents=True)
    reports = {"start (BC)": held_out(cfg, start.path, out / "eval-start")}
    runs: dict[str, dict[str, Any]] = {}
    for algo in args.algos:
        tick = time.perf_counter()
        budget = rl_config(cfg, algo, iterations=1_000_000, time_budget_s=60 * args.minutes)
        ref = rl_finetune_from(
            cfg.model_copy(update={"finetune": budget, "name": algo}),
            start,
            checkpoints=out / "checkpoints",
        )
        minutes = (time.perf_counter() - tick) / 60
        records = read_metrics(Path(ref.path).parent)
        reports[algo] = held_out(cfg, ref.path, out / f"eval-{algo}")
        runs[algo] = {
            "minutes": minutes,
            "env_steps": records[-1]["env_steps"],
            "iterations": records[-1]["step"],
            **time_shares(records),
            "curves": str(Path(ref.path).parent / "learning_curves.png"),
        }

    # -- report ------------------------------------------------------------------------------
    if rows:
        print(
            f"\n{'algo':<5} {'learner threads':>15} {'env-steps/s':>12} {'updates/s':>10} "
            f"{'rollout':>8} {'learn':>6} {'sync':>6}"
        )
        for t in rows:
            print(
                f"{t['algo']:<5} {t['learner_threads']!s:>15} {t['env_steps_per_s']:>12,.0f} "
                f"{t['updates_per_s']:>10.2f} {t['rollout']:>8.0%} {t['learn']:>6.0%} "
                f"{t['sync']:>6.1%}"
            )
    base = reports["start (BC)"]
    print(
        f"\nheld-out suite: {base.episodes} episodes per arm, the same seeds "
        f"({', '.join(r.variant for r in base.rows)})"
    )
    print(
        f"{'policy':<11} {'success':>8}  {'95% interval':<15} {'gain':>7} {'minutes':>8} "
        f"{'env steps':>10} {'env-steps/s':>11} {'updates/s':>9} {'rollout':>8} {'learn':>6}"
    )
    for label, report in reports.items():
        run = runs.get(label, {})
        low, high = report.ci95
        gain = report.success_rate - base.success_rate
        print(
            f"{label:<11} {report.success_rate:>8.1%}  [{low:.1%}, {high:.1%}] "
            f"{gain:>+7.1%} {run.get('minutes', 0.0):>8.1f} {int(run.get('env_steps', 0)):>10,} "
            f"{run.get('env_steps_per_s', 0.0):>11,.0f} {run.get('updates_per_s', 0.0):>9.2f} "
            f"{run.get('rollout', 0.0):>8.0%} {run.get('learn', 0.0):>6.0%}"
        )
    print("\nwhy episodes failed (by the task family's failure modes):")
    for label, report in reports.items():
        print(
            f"  {label:<11} {report.episodes - report.successes:>4} failed: {report.why_failed()}"
        )
    for algo in args.algos:
        separated = reports[algo].ci95[0] > base.ci95[1]
        print(
            f"{algo}: {'non-overlapping' if separated else 'overlapping'} intervals vs the start; "
            f"curves: {runs[algo]['curves']}"
        )
    results = {
        "throughput": rows,
        "runs": runs,
        "reports": {
            k: {"success": r.success_rate, "ci95": r.ci95, "failures": r.failures}
            for k, r in reports.items()
        },
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results: {out / 'results.json'}")
    headline = [f"start_success={base.success_rate:.3f}"]
    for algo in args.algos:
        r = reports[algo]
        headline += [
            f"{algo}_success={r.success_rate:.3f}",
            f"{algo}_gain={r.success_rate - base.success_rate:+.3f}",
            f"{algo}_separated={int(r.ci95[0] > base.ci95[1])}",
            f"{algo}_env_steps_per_s={runs[algo]['env_steps_per_s']:.0f}",
        ]
    by = {(t["algo"], t["learner_threads"]): t for t in rows}
    if ("ppo", 1) in by and ("ppo", "all") in by:
        speedup = by[("ppo", "all")]["env_steps_per_s"] / by[("ppo", 1)]["env_steps_per_s"]
        headline += [
            f"ppo_learner_threads_speedup={speedup:.2f}",
            f"ppo_rollout_share={by[('ppo', 'all')]['rollout']:.2f}",
        ]
    print(" ".join(headline))


if __name__ == "__main__":
    main()
