"""Success at inference delay: today's policy against a delay-conditioned one (issue 52).

Two policies of the quick start's task (``configs/quickstart.yaml``: touch-single, the demo's
VLA at 32 px) with chunks long enough for the delays (``--chunk-len``, 24: an asynchronous
loop needs ``2 d`` actions for ``d`` ticks), fine-tuned the same way from the same base on the
same demonstrations through ``robo-pipe finetune``, their chunks holding still past each
episode's end (``finetune.bc.after_end: hold``):

- **today's**: behaviour cloning as the pipeline trains it;
- **delay-conditioned** (``policy.prefix_ticks``): the same, on simulated inference delays of
  0..``--prefix`` ticks, told the committed prefix (training-time real-time chunking);
- with ``--rl SECONDS``, **delay-conditioned + PPO**: that BC warm start, then PPO for SECONDS
  whose rollouts play the delays too (:mod:`stages.finetune.committed`), each decision
  executing ``--rl-horizon`` actions (8: a span of the chunk, as the asynchronous runtime
  executes one), with the RL demo's rounds and progress shaping and metaworld-rl's small steps
  for a full fine-tune.

Each is played on the same ``--episodes`` held-out seeds (touch-single-shifted) at zero delay,
then at ``d`` ticks of inference (``--delays``), asynchronous (the runtime's queue, anchoring and
blend; a conditioned policy is told what the queue commits) and synchronous (the robot holds
while it infers), each paired with the policy itself at zero delay on the same seeds (exact
McNemar, every seed, no early stop): "not worse" is the paired test's verdict at the promotion
margin.

``--quick``: chunk 8, prefix 4, delays 3, 40 seeds, 300 BC steps (the code path, not the
figures). Run: ``python benchmarks/delay.py [--quick]``; the last line is ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root is not on the path

from pipelines.config import CONFIG_DIR, load_config  # noqa: E402
from robo_pipe.errors import RoboPipeError  # noqa: E402

CONFIG = "quickstart.yaml"


def finetune(home: Path, sets: list[str]) -> Path:
    """``robo-pipe finetune -c quickstart.yaml`` with ``sets`` on ``home``: its checkpoint."""
    command = [sys.executable, "-m", "pipelines.cli", "finetune", "-c", CONFIG, "--json"]
    command += [arg for s in sets for arg in ("--set", s)]
    start = time.perf_counter()
    env = {**os.environ, "ROBO_PIPE_HOME": str(home)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"finetune failed ({done.returncode}):\n{done.stderr[-4000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"finetune {sets}: {time.perf_counter() - start:.0f} s", flush=True)
    return Path(record["path"])


def played(checkpoint: Path, label: str, out: Path, episodes: int, delays: list[int]) -> dict:
    """``checkpoint`` on the held-out seeds at zero delay, then at each delay in both modes,
    paired with itself at zero delay: ``key=value`` figures."""
    from stages.evaluate import evaluate
    from stages.evaluate.config import DelayConfig, SequentialConfig

    cfg = load_config(CONFIG_DIR / CONFIG, [f"evaluate.episodes={episodes}"])
    ev = cfg.evaluate.model_copy(update={"sequential": SequentialConfig(enabled=False)})
    args = (cfg.robot, cfg.scene, cfg.sim)
    zero = evaluate(checkpoint, *args, ev, cfg.seed, out / f"{label}-0")
    period_ms = 1000.0 / 10.0  # rp5 at 10 Hz: d ticks of inference are d periods
    print(f"{label} d=0: {zero.success_rate:.1%} of {zero.episodes}", flush=True)
    figures = {f"{label}_d0": f"{zero.success_rate:.3f}"}
    for d in delays:
        for mode in ("async", "sync"):
            delay = DelayConfig(mode=mode, inference_ms=d * period_ms, margin_ms=0.0)
            try:
                report = evaluate(
                    checkpoint, *args, ev.model_copy(update={"delay": delay}), cfg.seed,
                    out / f"{label}-{mode}-{d}", baseline_outcomes=zero.successes_by_episode(),
                    margin=cfg.registry.promotion.margin,
                )  # fmt: skip
            except RoboPipeError as err:  # an async chunk that cannot cover the delay
                print(f"{label} {mode} d={d}: refused: {err}", flush=True)
                continue
            c = report.comparison
            assert c is not None
            print(
                f"{label} {mode} d={d}: {report.success_rate:.1%} (zero delay "
                f"{c.baseline_success_rate:.1%}, {c.difference:+.1%}, 95% CI "
                f"{c.difference_ci95[0]:+.1%} .. {c.difference_ci95[1]:+.1%}, p {c.p_value:.3g}: "
                f"{c.decision})",
                flush=True,
            )
            key = f"{label}_{mode}_d{d}"
            figures |= {
                key: f"{report.success_rate:.3f}",
                f"{key}_p": f"{c.p_value:.3g}",
                f"{key}_not_worse": str(int(c.passed)),
            }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small and fast (see the docstring)")
    parser.add_argument("--chunk-len", type=int, help="actions per chunk (default 24; quick 8)")
    parser.add_argument("--prefix", type=int, help="largest delay trained on (12; quick 4)")
    parser.add_argument("--delays", type=int, nargs="+", help="ticks played (3 12; quick 3)")
    parser.add_argument("--episodes", type=int, help="held-out seeds (200; quick 40)")
    parser.add_argument("--steps", type=int, help="BC steps (quickstart's 1000; quick 300)")
    parser.add_argument("--rl", type=float, metavar="SECONDS", help="also PPO with delays")
    parser.add_argument(
        "--rl-horizon", type=int, default=8, help="actions a PPO decision executes (8)"
    )
    parser.add_argument("--home", type=Path, help="a home to train in (default: a temporary one)")
    args = parser.parse_args()
    chunk = args.chunk_len or (8 if args.quick else 24)
    prefix = args.prefix or (4 if args.quick else 12)
    delays = args.delays or ([3] if args.quick else [3, 12])
    episodes = args.episodes or (40 if args.quick else 200)
    steps = args.steps or (300 if args.quick else 1000)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home or Path(tmp) / "home"
        # Past an episode's end a chunk holds still (both): at a long delay the runtime
        # executes exactly those positions of an episode's first chunk (masked, today's policy
        # fell from 86.5% at zero delay to 48% at 12 ticks on these seeds).
        common = [
            f"policy.chunk_len={chunk}",
            f"finetune.bc.steps={steps}",
            "finetune.bc.after_end=hold",
        ]
        today = finetune(home, common)
        conditioned = finetune(home, [*common, f"policy.prefix_ticks={prefix}"])
        rl = None
        if args.rl:  # the same BC warm start (reused), then PPO playing delays
            rl = finetune(
                home,
                [
                    *common,
                    f"policy.prefix_ticks={prefix}",
                    "finetune.algo=ppo",
                    "finetune.rl.iterations=1000000",
                    f"finetune.rl.time_budget_s={args.rl}",
                    # The RL demo's rounds (the quick start inherits the tiny profile's 8
                    # samples per update, a smoke test's).
                    f"finetune.rl.horizon={args.rl_horizon}",
                    "finetune.rl.workers=2",
                    "finetune.rl.envs_per_worker=16",
                    "finetune.rl.ppo.steps_per_env=32",
                    "finetune.rl.ppo.minibatch_size=256",
                    "scene.reward.progress_weight=2.0",
                    # Every parameter trains (the quick start's trainable: all): small steps, as
                    # configs/metaworld-rl.yaml found (1e-4 wrecked the BC policy there).
                    "finetune.rl.ppo.lr=0.00003",
                    "finetune.rl.ppo.kl_coef=0.1",
                ],
            )
        out = Path(tmp) / "eval"
        figures = {"chunk_len": str(chunk), "prefix_ticks": str(prefix), "episodes": str(episodes)}
        figures |= played(today, "today", out, episodes, delays)
        figures |= played(conditioned, "conditioned", out, episodes, delays)
        if rl is not None:
            figures |= played(rl, "conditioned_ppo", out, episodes, delays)
    figures["minutes"] = f"{(time.perf_counter() - start) / 60:.1f}"
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
