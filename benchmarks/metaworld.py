"""Meta-World MT10 as people compare it: per-task success of robo-pipe's fine-tuned VLA beside
Meta-World's scripted experts on the same held-out seeds, demonstrations per task, training
minutes on this machine and env steps/s with camera images.

1. The pipeline (``robo-pipe run``'s flow) on ``--config`` (default
   ``configs/metaworld-mt10.yaml``; ``--quick``: ``configs/metaworld-tiny.yaml``, two tasks at
   the tiny profile's sizes, which checks the plumbing, not the learning), in ``$ROBO_PIPE_HOME``
   (stages an earlier run finished are reused: a second call only measures the experts).
2. The scripted experts (``metaworld.policies``) on exactly the seeds the policy's evaluation
   played, task by task, through :class:`~sim_scenes.metaworld.batched.MetaWorldBatchedEnv`.
3. One row per task: policy success with its 95% Wilson interval, the expert's, the policy's
   failures by the family's modes; then the totals. ``steps_per_s`` is the experts' env steps
   per second with images (physics, rendering and the expert in the workers); ``eval_steps_per_s``
   the evaluation's (the policy's inference included). load is the 1-minute load average.

Run: ``python benchmarks/metaworld.py [--quick] [--experts-only]`` (needs ``make
metaworld-env``; the full config takes about 45 minutes on 2 cores the first time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from robo_pipe.errors import RoboPipeError
from robots.sawyer import SAWYER
from sim_scenes.episodes import play_episodes
from sim_scenes.metaworld.batched import MetaWorldBatchedEnv
from sim_scenes.metaworld.env import metaworld_python
from sim_scenes.metaworld.tasks import METAWORLD, MT10_TASKS
from sim_scenes.seeds import episode_seeds
from stages.statistics import wilson_interval

ROOT = Path(__file__).resolve().parents[1]


def run_pipeline(config: Path) -> dict[str, Any]:
    """The pipeline on ``config`` (stages already done are reused), its result record."""
    from pipelines.run.flow import train_simulate_deploy

    result = train_simulate_deploy(config=str(config)).to_json()
    return dict(result)


def expert_success(
    seeds_by_task: dict[str, list[int]], camera: str, size: int
) -> tuple[dict[str, list[bool]], float]:
    """Per task (``metaworld/<task>``): the scripted expert's success on each seed; and its env
    steps/s with ``size`` px images of ``camera``, over every task."""
    results, steps, seconds = {}, 0, 0.0
    for task, seeds in seeds_by_task.items():
        tick = time.perf_counter()
        variant = METAWORLD.variant(task.split("/")[-1])
        with MetaWorldBatchedEnv(
            SAWYER, variant, 8, (camera,), size, workers=2, autoreset=False
        ) as env:
            records = play_episodes(env, METAWORLD.expert(SAWYER), seeds)
        seconds += time.perf_counter() - tick
        steps += sum(r.length for r in records)
        results[task] = [r.success for r in records]
    return results, steps / seconds


def table(record: dict[str, Any], experts: dict[str, list[bool]]) -> dict[str, float]:
    """Print the per-task table; return its figures as ``key=value`` pairs."""
    report = json.loads((Path(record["run_dir"]) / "evaluate" / "eval_report.json").read_text())
    info = json.loads((Path(record["dataset"]) / "meta" / "info.json").read_text())
    episodes = int(info["total_episodes"])
    outcomes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for outcome in report["outcomes"]:
        outcomes[outcome["variant"]].append(outcome)
    modes = [m.name for m in METAWORLD.failure_modes]
    print(
        f"{'task':<22} {'VLA':>6} {'95% CI':>13} {'expert':>7} "
        + " ".join(f"{m:>14}" for m in modes)
    )
    figures: dict[str, float] = {}
    for task, played in outcomes.items():
        solved = sum(o["success"] for o in played)
        low, high = wilson_interval(solved, len(played))
        expert = sum(experts[task]) / len(experts[task])
        failures = [sum(o.get("failure") == m for o in played) for m in modes]
        name = task.split("/")[-1]
        print(
            f"{name:<22} {solved / len(played):>6.0%} {f'{low:.0%}-{high:.0%}':>13} "
            f"{expert:>7.0%} " + " ".join(f"{n:>14}" for n in failures)
        )
        figures[f"{name}_vla"] = solved / len(played)
        figures[f"{name}_expert"] = expert
    vla = [f for k, f in figures.items() if k.endswith("_vla")]
    expert_all = [f for k, f in figures.items() if k.endswith("_expert")]
    stages = record["stages"]
    training_s = sum(stages.get(s, {}).get("seconds", 0.0) for s in ("pretrain", "finetune"))
    figures |= {
        "mean_vla": sum(vla) / len(vla),
        "min_vla": min(vla),
        "mean_expert": sum(expert_all) / len(expert_all),
        "episodes_per_task": report["rows"][0]["episodes"],
        "demos_per_task": episodes / len(outcomes),
        "training_min": training_s / 60.0,
        "pipeline_min": sum(s.get("seconds", 0.0) for s in stages.values()) / 60.0,
        "eval_steps_per_s": float(report["env_steps_per_s"]),
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the two-task tiny config")
    parser.add_argument("--config", type=Path, help="a Meta-World pipeline config")
    parser.add_argument(
        "--experts-only",
        action="store_true",
        help="only the scripted experts on every MT10 task (2 seeds each with --quick, else 10)",
    )
    args = parser.parse_args()
    config = args.config or ROOT / "configs" / (
        "metaworld-tiny.yaml" if args.quick else "metaworld-mt10.yaml"
    )
    try:
        metaworld_python()  # a missing environment is named before any work
        if args.experts_only:
            seeds = episode_seeds(0, 2 if args.quick else 10, "benchmark")
            experts, steps_per_s = expert_success(
                {f"metaworld/{t.removesuffix('-v3')}": seeds for t in MT10_TASKS}, "corner2", 64
            )
            figures = {
                f"{task.split('/')[-1]}_expert": sum(ok) / len(ok) for task, ok in experts.items()
            }
            for task, rate in figures.items():
                print(f"{task:<34} {rate:>6.0%}")
        else:
            record = run_pipeline(config)
            from pipelines.config import load_config

            cfg = load_config(config)
            report = Path(record["run_dir"]) / "evaluate" / "eval_report.json"
            seeds_by_task: dict[str, list[int]] = defaultdict(list)
            for outcome in json.loads(report.read_text())["outcomes"]:
                seeds_by_task[outcome["variant"]].append(int(outcome["seed"]))
            experts, steps_per_s = expert_success(
                seeds_by_task, cfg.scene.cameras[0], cfg.scene.image_size
            )
            figures = table(record, experts)
    except RoboPipeError as err:  # a missing environment, a bad config: exit 2
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(
        " ".join(f"{k}={v:.3g}" for k, v in figures.items())
        + f" steps_per_s={steps_per_s:.0f} load={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
