"""Fine-tuning: training throughput on Ray Train, memory, LoRA vs full fine-tuning, and whether
the instruction matters.

1. Pretrains the base for the demo config (cached under $ROBO_PIPE_HOME after the first run)
   and collects the target task's dataset (touch-mixed).
2. Throughput: short runs with 1 and 2 Ray Train workers (DDP), samples/s after warm-up, the
   2-vs-1 scaling ratio and each run's peak worker memory; LoRA, and every parameter trained
   (what pretraining and ``trainable: all`` do: DDP all-reduces every gradient).
3. Success, closed loop in the simulator on held-out seeds (the ``eval`` seed stream, never
   used for training data) of the target task: the base before fine-tuning, LoRA fine-tuning
   and full fine-tuning (the same steps), with 95% Wilson intervals and trainable/total
   parameters. LoRA must come within 10 points of full fine-tuning with <= 10% trainable.
4. Instruction: the same scenes, with the instruction naming another object of the scene;
   success is judged against the newly named object.

Run: ``python benchmarks/finetune.py [--quick] [--episodes N]`` (about 15 minutes on 2 cores
with a cold cache, --quick about 5 minutes once the base exists).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from pipelines.config import CONFIG_DIR, PipelineConfig, load_config
from pipelines.home import home_dir
from pipelines.steps.training import pretrain_base
from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.episodes import play_episodes
from sim_scenes.seeds import episode_seeds
from stages.collect import collect
from stages.finetune import FinetuneConfig, finetune
from stages.finetune.checkpoints import read_metrics
from stages.policy.checkpoint import CheckpointRef, load_policy
from stages.statistics import wilson_interval


def success(cfg: PipelineConfig, checkpoint: str, episodes: int, retarget: int = 0) -> float:
    """Closed-loop success rate on the target variant's first ``episodes`` eval seeds."""
    policy = load_policy(checkpoint).eval()
    env = make_env(get_robot(cfg.robot), cfg.scene, cfg.sim, autoreset=False, retarget=retarget)
    try:
        seeds = episode_seeds(cfg.seed, episodes, "eval")
        records = play_episodes(env, lambda _, obs: policy.predict_chunk(obs)[:, 0], seeds)
    finally:
        env.close()
    return float(np.mean([r.success for r in records]))


def row(label: str, rate: float, episodes: int, ref: CheckpointRef | None = None) -> str:
    low, high = wilson_interval(round(rate * episodes), episodes)
    params = f"{ref.trainable_params:>9,} / {ref.total_params:,}" if ref else f"{'-':>9}"
    return f"{label:<34} {rate:>7.1%}  [{low:.1%}, {high:.1%}]  {params}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 eval episodes, shorter runs")
    parser.add_argument("--episodes", type=int, default=200, help="eval episodes per policy")
    parser.add_argument("--config", type=Path, default=CONFIG_DIR / "demo.yaml")
    args = parser.parse_args()
    episodes = 100 if args.quick else args.episodes
    cfg = load_config(args.config)

    start = time.perf_counter()
    base = pretrain_base(cfg)
    assert base is not None, "the benchmark fine-tunes the default VLA (policy.type: default)"
    print(f"base ready in {time.perf_counter() - start:.0f} s: {base.path}")
    dataset = collect(
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.collect,
        cfg.seed,
        home_dir("datasets") / cfg.dataset_name(),
    )

    # -- throughput: 1 vs 2 Ray Train workers, LoRA and every parameter ----------------------
    steps = 120 if args.quick else 300
    throughput: dict[tuple[str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for trainable in ("lora", "all"):
            for workers in (1, 2):
                bc = cfg.finetune.bc.model_copy(
                    update={"steps": steps, "workers": workers, "log_every": 20}
                )
                ref = finetune(
                    dataset,
                    cfg.policy,
                    FinetuneConfig(trainable=trainable, bc=bc),
                    base,
                    cfg.seed,
                    Path(tmp),
                    name=f"throughput-{trainable}-{workers}",
                )
                logged = read_metrics(Path(ref.path).parent)[2:]  # skip warm-up records
                throughput[trainable, workers] = (
                    float(np.mean([m["samples_per_s"] for m in logged])),
                    max(m["peak_rss_mb"] for m in logged),
                )

    # -- LoRA vs full fine-tuning, base, instruction ----------------------------------------
    results = {}
    for trainable in ("lora", "all"):
        t = time.perf_counter()
        ref = finetune(
            dataset,
            cfg.policy,
            cfg.finetune.model_copy(update={"trainable": trainable}),
            base,
            cfg.seed,
            home_dir("checkpoints"),
            name=f"{cfg.name}-bench-{trainable}",
        )
        results[trainable] = (ref, time.perf_counter() - t)
    lora, full = results["lora"][0], results["all"][0]
    rates = {
        "base (before fine-tuning)": (success(cfg, base.path, episodes), base),
        "LoRA fine-tuned": (success(cfg, lora.path, episodes), lora),
        "full fine-tuned": (success(cfg, full.path, episodes), full),
        "LoRA, instruction names another": (success(cfg, lora.path, episodes, retarget=1), None),
    }

    print(
        f"\nfine-tuning on {cfg.scene.variant}: {dataset.episodes} demos, {dataset.frames} frames"
    )
    print(f"{'trained':<8} {'Ray Train workers':<18} {'samples/s':>10} {'peak worker RSS':>16}")
    for (trainable, workers), (sps, rss) in throughput.items():
        print(f"{trainable:<8} {workers:<18} {sps:>10,.0f} {rss:>13,.0f} MB")
    scaling = throughput["lora", 2][0] / throughput["lora", 1][0]
    scaling_all = throughput["all", 2][0] / throughput["all", 1][0]
    print(f"scaling 2 vs 1 workers: LoRA {scaling:.2f}x, every parameter {scaling_all:.2f}x")
    print(f"\n{episodes} held-out episodes (eval seeds) of {cfg.scene.variant}")
    print(f"{'policy':<34} {'success':>7}  {'95% interval':<16} trainable / total params")
    for label, (rate, policy_ref) in rates.items():
        print(row(label, rate, episodes, policy_ref))
    for trainable, (ref, seconds) in results.items():
        print(f"{trainable} fine-tuning wall time: {seconds:.0f} s ({ref.step} steps)")
    gap = rates["full fine-tuned"][0] - rates["LoRA fine-tuned"][0]
    share = lora.trainable_params / lora.total_params
    print(
        f"lora_vs_full_gap_points={100 * gap:.1f} lora_trainable_share={share:.3f} "
        f"scaling_2v1={scaling:.2f} scaling_all_2v1={scaling_all:.2f} "
        f"lora_sps_1={throughput['lora', 1][0]:.0f} all_sps_1={throughput['all', 1][0]:.0f} "
        f"lora_success={rates['LoRA fine-tuned'][0]:.3f} "
        f"base_success={rates['base (before fine-tuning)'][0]:.3f}"
    )


if __name__ == "__main__":
    main()
