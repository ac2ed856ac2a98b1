"""How fast does evaluation run, how does it scale over Ray workers, and where does time go?

Evaluates one policy on the same suite (the demo's held-out variants x N seeds) three ways --
in the calling process, with 1 Ray worker and with 2 -- and prints episodes/s and env-steps/s,
the 2-vs-1 worker scaling ratio, Ray-sharded against a single process on the same episodes
(2 single-threaded Ray workers against the in-process loop with 2 threads: both use 2 cores)
and the share of worker time in simulation, rendering and
inference. Ray itself is started before timing; worker start-up (policy load, scene build)
is reported separately and the rates are over the evaluation proper.

The policy is a checkpoint (``--policy``) or, by default, a freshly initialised default VLA: its
inference cost is the trained one's, and since it rarely succeeds every episode runs its full
50 steps, so the figures are per env-step comparable.

Run: ``python benchmarks/eval_throughput.py [--quick] [--episodes N] [--policy PATH]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from pipelines.config import CONFIG_DIR, load_config
from stages.evaluate.report import summarize
from stages.evaluate.shards import run_suite
from stages.policy.checkpoint import save_new_policy
from stages.ray_runtime import init_ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 episodes per variant")
    parser.add_argument("--episodes", type=int, default=96, help="episodes per variant")
    parser.add_argument("--policy", type=Path, help="checkpoint or export (default: fresh VLA)")
    args = parser.parse_args()
    episodes = 32 if args.quick else args.episodes
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    init_ray(None)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        policy = args.policy
        if policy is None:
            policy = save_new_policy(
                cfg.policy, cfg.scene.cameras, cfg.scene.image_size, Path(tmp) / "fresh-vla"
            )
        for workers in (0, 1, 2):
            config = cfg.evaluate.model_copy(
                update={"episodes": episodes, "workers": workers, "episodes_per_shard": 16}
            )
            shards, facts = run_suite(policy, cfg.robot, cfg.scene, cfg.sim, config, cfg.seed)
            rows[workers] = summarize(str(policy), shards, facts, cfg.seed)
    print(f"\npolicy {policy}; suite {', '.join(r.variant for r in rows[0].rows)}")
    header = f"{'workers':<14} {'episodes':>8} {'wall s':>7} {'start s':>7} {'episodes/s':>11} "
    header += f"{'env-steps/s':>12}"
    print(f"{header}  time share")
    for workers, r in rows.items():
        label = "in-process" if workers == 0 else f"{workers} Ray"
        shares = " ".join(f"{k} {v:.0%}" for k, v in sorted(r.time_share.items()))
        print(
            f"{label:<14} {r.episodes:>8} {r.wall_s:>7.1f} {r.startup_s:>7.1f} "
            f"{r.episodes_per_s:>11.2f} {r.env_steps_per_s:>12,.0f}  {shares}"
        )
    same = rows[0].outcomes == rows[1].outcomes == rows[2].outcomes
    scaling = rows[2].env_steps_per_s / rows[1].env_steps_per_s
    # Both use the 2 cores: the plain loop with 2 threads, Ray with 2 single-threaded workers.
    sharded = rows[2].env_steps_per_s / rows[0].env_steps_per_s
    wall = rows[0].wall_s / rows[2].wall_s  # start-up included: what a short suite feels like
    print(f"identical per-episode outcomes across the three runs: {same}")
    print(
        f"scaling_2v1={scaling:.2f} ray_2w_vs_in_process={sharded:.2f} "
        f"ray_2w_vs_in_process_wall={wall:.2f} "
        f"env_steps_per_s_2w={rows[2].env_steps_per_s:.0f} "
        f"inference_share_2w={rows[2].time_share.get('inference', 0.0):.2f}"
    )


if __name__ == "__main__":
    main()
