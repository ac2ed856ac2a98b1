"""RL fine-tuning on Ray: throughput, where the time goes, bytes per sync, and whether PPO and
SAC improve a behaviour-cloned VLA.

1. The start: the demo config's BC fine-tune (issue 4's: LoRA on the pretrained base, 2,000
   demonstrations; ~99% held-out, so RL must hold that line), or with ``--weak-start`` a BC
   fine-tune on a *small* set of demonstrations (``--bc-demos``, ``--bc-steps``) that succeeds
   only part of the time, where RL has room to improve; or any checkpoint (``--start``).
2. Throughput: a few iterations of each algorithm with 1 and 2 rollout workers: env-steps/s,
   updates/s, the share of wall time in rollout, learning and weight sync, and bytes per sync
   against the full model (LoRA adapters + action head, float16, vs every weight in float32).
3. Learning: each algorithm for ``--minutes`` of wall time (2 rollout workers + the learner on
   this machine's 2 cores), then the start and the result on the held-out suite (the evaluate
   stage's variants and seeds: never trained on), with 95% Wilson intervals. Curves are saved
   as ``learning_curves.png`` beside each run's checkpoints.

Run: ``python benchmarks/rl_finetune.py [--minutes 12] [--algos ppo sac]`` (about 40 minutes on
2 cores once the base is cached; ``--quick`` runs a 2-minute smoke version of every part).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from pipelines.config import CONFIG_DIR, PipelineConfig, load_config
from pipelines.home import home_dir
from pipelines.steps import pretrain_base, rl_finetune_from
from stages.collect import collect
from stages.evaluate import evaluate
from stages.finetune import FinetuneConfig, finetune
from stages.finetune.checkpoints import read_metrics
from stages.policy.checkpoint import BaseRef, CheckpointRef, checkpoint_hash, read_policy_meta

THROUGHPUT_ITERATIONS = 6


def start_checkpoint(cfg: PipelineConfig, demos: int | None, steps: int | None) -> CheckpointRef:
    """The base, LoRA-fine-tuned by BC: as the demo config says, or on ``demos``
    demonstrations for ``steps`` steps."""
    base = pretrain_base(cfg)
    name, collect_cfg, bc = cfg.name, cfg.collect, cfg.finetune.bc
    if demos is not None and steps is not None:
        name = f"{cfg.name}-rl-bench-bc{demos}x{steps}"
        collect_cfg = cfg.collect.model_copy(update={"episodes": demos})
        bc = bc.model_copy(update={"steps": steps, "checkpoint_every": steps})
    suffix = "" if demos is None else f"-rl-bench-{demos}"
    dataset = collect(
        cfg.robot,
        cfg.scene,
        cfg.sim,
        collect_cfg,
        cfg.seed,
        home_dir("datasets") / f"{cfg.dataset_name()}{suffix}",
    )
    return finetune(
        dataset,
        cfg.policy,
        cfg.finetune.model_copy(update={"bc": bc}),
        base,
        cfg.seed,
        home_dir("checkpoints"),
        name=name,
    )


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


def rl_config(cfg: PipelineConfig, algo: str, **rl: object) -> FinetuneConfig:
    return cfg.finetune.model_copy(
        update={"algo": algo, "rl": cfg.finetune.rl.model_copy(update=rl)}
    )


def held_out(cfg: PipelineConfig, policy: str, out: Path) -> tuple[float, tuple[float, float]]:
    report = evaluate(policy, cfg.robot, cfg.scene, cfg.sim, cfg.evaluate, cfg.seed, out)
    return report.success_rate, report.ci95


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG_DIR / "demo.yaml")
    parser.add_argument("--algos", nargs="+", default=["ppo", "sac"], choices=["ppo", "sac"])
    parser.add_argument("--minutes", type=float, default=12.0, help="RL wall time per algorithm")
    parser.add_argument(
        "--weak-start", action="store_true", help="start from a BC fine-tune on few demos"
    )
    parser.add_argument("--bc-demos", type=int, default=40, help="--weak-start: demonstrations")
    parser.add_argument("--bc-steps", type=int, default=300, help="--weak-start: BC steps")
    parser.add_argument("--start", type=Path, help="start from this checkpoint instead")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a 2-minute smoke version")
    parser.add_argument(
        "--progress-weight", type=float, default=2.0, help="scene.reward.progress_weight"
    )
    args = parser.parse_args()
    sets = [f"scene.reward.progress_weight={args.progress_weight}"]
    if args.quick:
        sets += ["evaluate.episodes=20"]
        args.minutes = 0.5
    cfg = load_config(args.config, sets)

    start = (
        ref_of(args.start)
        if args.start
        else start_checkpoint(
            cfg,
            args.bc_demos if args.weak_start else None,
            args.bc_steps if args.weak_start else None,
        )
    )
    print(f"start: {start.path}")
    results: dict[str, dict[str, float]] = {}

    # -- throughput: 1 vs 2 rollout workers ------------------------------------------------
    throughput = []
    if not args.skip_throughput:
        with tempfile.TemporaryDirectory() as tmp:
            for algo in args.algos:
                for workers in (1, 2):
                    iterations = 3 if args.quick else THROUGHPUT_ITERATIONS
                    sac_small = cfg.finetune.rl.sac.model_copy(update={"learning_starts": 256})
                    short = rl_config(
                        cfg, algo, iterations=iterations, workers=workers, sac=sac_small
                    )
                    ref = rl_finetune_from(
                        cfg.model_copy(update={"finetune": short, "name": f"throughput-{workers}"}),
                        start,
                        checkpoints=Path(tmp),
                    )
                    logged = read_metrics(Path(ref.path).parent)
                    records = logged[1:]  # the first round includes start-up
                    wall = sum(r["rollout_s"] + r["learn_s"] + r["sync_s"] for r in records)
                    steps = logged[-1]["env_steps"] - logged[0]["env_steps"]
                    throughput.append(
                        {
                            "algo": algo,
                            "workers": workers,
                            "env_steps_per_s": steps / wall,
                            "updates_per_s": sum(r.get("updates", 0.0) for r in records) / wall,
                            "rollout": sum(r["rollout_s"] for r in records) / wall,
                            "learn": sum(r["learn_s"] for r in records) / wall,
                            "sync": sum(r["sync_s"] for r in records) / wall,
                            "sync_ms": 1000 * float(np.mean([r["sync_s"] for r in records])),
                            "sync_bytes": records[-1]["sync_bytes"],
                            "full_bytes": records[-1]["full_model_bytes"],
                        }
                    )

    # -- learning: each algorithm for --minutes, then the held-out suite --------------------
    out = home_dir("runs") / f"rl-bench-{time.strftime('%Y%m%dT%H%M%S')}"
    out.mkdir(parents=True)
    rate, ci = held_out(cfg, start.path, out / "eval-start")
    results["start (BC)"] = {"success": rate, "low": ci[0], "high": ci[1], "minutes": 0.0}
    for algo in args.algos:
        tick = time.perf_counter()
        budget = rl_config(cfg, algo, iterations=100_000, time_budget_s=60 * args.minutes)
        ref = rl_finetune_from(
            cfg.model_copy(update={"finetune": budget, "name": algo}),
            start,
            checkpoints=out / "checkpoints",
        )
        minutes = (time.perf_counter() - tick) / 60
        rate, ci = held_out(cfg, ref.path, out / f"eval-{algo}")
        records = read_metrics(Path(ref.path).parent)
        results[algo] = {
            "success": rate,
            "low": ci[0],
            "high": ci[1],
            "minutes": minutes,
            "env_steps": records[-1]["env_steps"],
            "iterations": records[-1]["step"],
            "curves": str(Path(ref.path).parent / "learning_curves.png"),  # type: ignore[dict-item]
        }

    # -- report ------------------------------------------------------------------------------
    if throughput:
        print(
            f"\n{'algo':<5} {'workers':>7} {'env-steps/s':>12} {'updates/s':>10} "
            f"{'rollout':>8} {'learn':>6} {'sync':>6} {'sync ms':>8} {'bytes/sync':>11} "
            f"{'of full':>8}"
        )
        for t in throughput:
            print(
                f"{t['algo']:<5} {t['workers']:>7} {t['env_steps_per_s']:>12,.0f} "
                f"{t['updates_per_s']:>10.2f} {t['rollout']:>8.0%} {t['learn']:>6.0%} "
                f"{t['sync']:>6.1%} {t['sync_ms']:>8.1f} {t['sync_bytes']:>11,} "
                f"{t['sync_bytes'] / t['full_bytes']:>8.1%}"
            )
        for algo in args.algos:
            rows = {t["workers"]: t for t in throughput if t["algo"] == algo}
            ratio = rows[2]["env_steps_per_s"] / rows[1]["env_steps_per_s"]
            print(f"{algo}: env-steps/s with 2 vs 1 rollout workers: {ratio:.2f}x")
    episodes = len(cfg.evaluate.variants or []) or 2
    print(f"\nheld-out suite, {cfg.evaluate.episodes} episodes x {episodes} variants")
    print(f"{'policy':<12} {'success':>8}  {'95% interval':<16} {'minutes':>8} {'env steps':>10}")
    for label, r in results.items():
        print(
            f"{label:<12} {r['success']:>8.1%}  [{r['low']:.1%}, {r['high']:.1%}]  "
            f"{r['minutes']:>8.1f} {int(r.get('env_steps', 0)):>10,}"
        )
    base = results["start (BC)"]
    for algo in args.algos:
        r = results[algo]
        separated = r["low"] > base["high"]
        print(
            f"{algo}: {'non-overlapping' if separated else 'overlapping'} intervals vs the start"
            f"{', >= 90%' if r['success'] >= 0.9 else ''}; curves: {r['curves']}"
        )
    (out / "results.json").write_text(json.dumps({"throughput": throughput, **results}, indent=1))
    print(f"results: {out / 'results.json'}")
    headline = [f"start_success={base['success']:.3f}"]
    headline += [f"{algo}_success={results[algo]['success']:.3f}" for algo in args.algos]
    if throughput:
        headline.append(
            f"sync_share_of_full={throughput[0]['sync_bytes'] / throughput[0]['full_bytes']:.3f}"
        )
    print(" ".join(headline))


if __name__ == "__main__":
    main()
