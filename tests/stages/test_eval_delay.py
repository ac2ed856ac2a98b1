"""Evaluation with an inference delay (``evaluate.delay``): zero delay is today's evaluation,
the paired comparison with zero delay, async refused when its chunk cannot cover the delay,
and the ticks at which a delayed chunk's actions are sent (sync and async)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from deploy_edge.latency_report import LatencyReport
from pipelines.config import load_config
from robots.spec import RobotSpec, get_robot
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedEnv, BatchedObservation
from sim_scenes.config import SceneConfig, SimConfig, SuccessConfig
from sim_scenes.episodes import play_episodes
from sim_scenes.expert import GRIPPER_OPENING, ScriptedExpert
from stages.evaluate import EvalConfig, evaluate
from stages.evaluate.config import DelayConfig, SequentialConfig
from stages.evaluate.delay import DelayedActor, DelayError, check_plan, delay_plan
from stages.policy.checkpoint import new_policy, save_policy
from tests.conftest import TINY_CONFIG
from tests.stages.tiny_models import TINY_POLICY

CFG = load_config(TINY_CONFIG)
SHORT = CFG.scene.model_copy(update={"episode_steps": 15})
SMALL = EvalConfig(
    variants=["touch-mixed-clutter"],  # one variant: the rule, not the suite, is under test
    episodes=3,
    workers=0,
    envs_per_worker=3,
    episodes_per_shard=3,
    sequential=SequentialConfig(enabled=False),
)


@pytest.fixture(scope="module")
def moving_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny policy (chunk of 3) with a large action head, so that it moves."""
    torch.manual_seed(1)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    with torch.no_grad():
        policy.action_head.weight.mul_(20.0)
    path = tmp_path_factory.mktemp("delay") / "ckpt"
    save_policy(policy, path, None)
    return path


def run(policy: Path, out: Path, delay: DelayConfig, **kw: object) -> object:
    config = SMALL.model_copy(update={"delay": delay})
    return evaluate(policy, CFG.robot, SHORT, CFG.sim, config, 0, out, **kw)  # type: ignore[arg-type]


def test_zero_delay_is_todays_evaluation_and_a_delay_is_compared_with_it(
    moving_checkpoint: Path, tmp_path: Path
) -> None:
    today = run(moving_checkpoint, tmp_path / "today", DelayConfig())
    zero = run(moving_checkpoint, tmp_path / "zero", DelayConfig(mode="async", inference_ms=0.0))
    assert zero.outcomes == today.outcomes, "0 ms plays today's evaluation"  # type: ignore[attr-defined]
    assert zero.delay is None and zero.comparison is None  # type: ignore[attr-defined]
    held_config = DelayConfig(inference_ms=250.0)
    held = run(moving_checkpoint, tmp_path / "sync250", held_config)
    assert held.outcomes != today.outcomes, "holding 3 ticks per action changes the episodes"  # type: ignore[attr-defined]
    assert held.delay is not None and (held.delay.ticks, held.delay.chunk_len) == (3, 3)  # type: ignore[attr-defined]
    c = held.comparison  # type: ignore[attr-defined]
    assert c is not None and c.baseline == f"{moving_checkpoint} at zero delay"
    assert held.baseline_outcomes == {  # type: ignore[attr-defined]
        v: "".join("1" if o["success"] else "0" for o in today.outcomes if o["variant"] == v)  # type: ignore[attr-defined]
        for v in ("touch-mixed-clutter",)
    }, "the baseline is the policy at zero delay, on the same seeds"
    text = (tmp_path / "sync250" / "report.md").read_text()
    assert "## Inference delay: sync, 250 ms" in text and "= 3 ticks of 100 ms" in text
    # A baseline given plays the same delay: the policy against itself there is a tie on
    # every seed, and the baseline's outcomes are the delayed ones, not today's.
    same = run(moving_checkpoint, tmp_path / "b", held_config, baseline=moving_checkpoint)
    c = same.comparison  # type: ignore[attr-defined]
    assert c is not None and c.baseline == f"{moving_checkpoint} at the same delay"
    assert c.difference == 0.0 and sum(c.discordant.values()) == 0, c
    assert same.baseline_outcomes == {  # type: ignore[attr-defined]
        v: "".join("1" if o["success"] else "0" for o in held.outcomes if o["variant"] == v)  # type: ignore[attr-defined]
        for v in ("touch-mixed-clutter",)
    }, "the baseline played the delay too"


def test_an_async_chunk_that_cannot_cover_the_delay_is_refused_before_any_episode(
    moving_checkpoint: Path, tmp_path: Path
) -> None:
    played: list[object] = []
    with pytest.raises(DelayError) as refused:
        run(
            moving_checkpoint,
            tmp_path / "out",
            DelayConfig(mode="async", inference_ms=250.0),
            on_shard=played.append,
        )
    assert (
        "a chunk of 3 actions x 100 ms = 300 ms cannot hold 10 Hz: inference p99 250 ms + "
        in str(refused.value)
    )
    assert "margin 20 ms = 3 ticks" in str(refused.value) and "6 actions (600 ms)" in str(
        refused.value
    )
    assert not played and not (tmp_path / "out").exists()


def test_the_delay_can_come_from_a_latency_report(rp5: RobotSpec, tmp_path: Path) -> None:
    report = LatencyReport(
        export="e", target="t", passed=True, reasons=[], budget_ms=100.0, allowed_misses=0,
        steps=10, warmup=1, p50_ms=120.0, p95_ms=150.0, p99_ms=180.0, max_ms=190.0,
        mean_ms=125.0, jitter_ms=5.0, misses=0, errors=0, inference_ticks=2,
    )  # fmt: skip
    path = tmp_path / "latency_report.json"
    path.write_text(json.dumps(report.to_json()))
    plan = delay_plan(DelayConfig(mode="async", latency_report=str(path)), rp5)
    assert plan is not None and (plan.inference_ms, plan.ticks) == (180.0, 2), "a sync gate's"
    assert str(path) in plan.source
    path.write_text(json.dumps({**report.to_json(), "mode": "async", "inference_p99_ms": 230.0}))
    plan = delay_plan(DelayConfig(mode="async", latency_report=str(path)), rp5)
    assert plan is not None and (plan.inference_ms, plan.ticks) == (230.0, 3), "inference alone"
    path.write_text("{}")
    with pytest.raises(DelayError, match="latency_report"):
        delay_plan(DelayConfig(latency_report=str(path)), rp5)
    with pytest.raises(ValueError, match="not both"):
        DelayConfig(inference_ms=5.0, latency_report=str(path))


class _Counter:
    """A policy whose chunk from its ``k``-th inference (k = 1, 2, ...) plans target ``100 k +
    i`` at its action ``i`` from a zero state (action 0 is ``100 k``, every next one ``+1``; in
    every dimension): what was sent tells which chunk and which of its actions. async sends
    targets from the zero state (anchored, :meth:`~robots.spec.RobotSpec.chunk_targets`), sync
    the actions themselves."""

    robot = "rp5"
    cameras: tuple[str, ...] = ()
    image_size, state_dim, action_dim = 32, 6, 6

    def __init__(self, chunk_len: int) -> None:
        self.chunk_len, self.calls = chunk_len, 0

    def predict_chunk(self, obs: BatchedObservation) -> np.ndarray:
        self.calls += 1
        chunk = np.ones(self.chunk_len, dtype=np.float32)
        chunk[0] = 100.0 * self.calls
        return np.repeat(chunk[None, :, None], 6, axis=2).repeat(len(obs.state), axis=0)


class _Env:
    num_envs = 1


def _sent(rp5: RobotSpec, ticks: int, chunk_len: int = 6, **delay: object) -> list[float]:
    """The first arm dimension of the action sent at each of ``ticks`` ticks (0: safe) by a
    :class:`_Counter` policy, under ``evaluate.delay`` settings ``delay``."""
    policy = _Counter(chunk_len)
    plan = delay_plan(DelayConfig.model_validate(delay), rp5)
    assert plan is not None
    # Unbounded actions: an anchored target is sent as ``target - state`` unclipped.
    wide = dataclasses.replace(rp5.action, low=(-1e6,) * 6, high=(1e6,) * 6)
    actor = DelayedActor(
        policy, check_plan(plan, policy, "counter"), dataclasses.replace(rp5, action=wide)
    )
    obs = BatchedObservation({}, np.zeros((1, 6), np.float32), ["touch"])
    return [float(actor.act(_Env(), obs)[0, 0]) for _ in range(ticks)]  # type: ignore[arg-type]


def test_delayed_chunks_are_sent_at_the_ticks_they_plan(rp5: RobotSpec) -> None:
    """250 ms + 20 ms margin at 10 Hz is 3 ticks. async, chunk 6: the chunk from tick 0 arrives
    at tick 3 and sends its actions 3, 4, 5 (0-2 are past); the next inference starts at tick 3
    (3 left) and its chunk (observation of tick 3) sends actions 3-5 at ticks 6-8; the first 3
    ticks send the safe action. sync: the robot holds 3 ticks, sends action 0 (or the first
    ``execute``), infers again. Broken on purpose (a chunk planned from its arrival tick, an
    unanchored chunk): this fails."""
    after = [103, 104, 105, 203, 204, 205, 303, 304, 305]
    assert _sent(rp5, 12, mode="async", inference_ms=250.0) == [0, 0, 0, *after]
    assert _sent(rp5, 8, mode="sync", inference_ms=250.0) == [0, 0, 0, 100, 0, 0, 0, 200]
    twice = [0, 0, 0, 100, 1, 0, 0, 0, 200, 1]
    assert _sent(rp5, 10, mode="sync", inference_ms=250.0, execute=2) == twice
    with pytest.raises(DelayError, match="execute 7 > the policy's chunk of 6 actions"):
        _sent(rp5, 1, mode="sync", inference_ms=250.0, execute=7)


def test_a_longer_chunk_triggers_earlier_and_its_seam_is_blended(rp5: RobotSpec) -> None:
    """Chunk 8 at 3 ticks: the runtime's trigger starts the next inference as soon as a chunk
    arrives (at 5 planned: 3 + the 2 ticks of overlap the chunk leaves room for), so each new
    chunk arrives with 2 ticks of the old plan left. ``blend: none`` switches at once (the new
    chunk's aligned actions 3, 4, ... from its arrival); ``linear`` crosses over in 3 steps:
    2/3 old + 1/3 new, then 1/3 old + 2/3 new."""
    switched = [0, 0, 0, 103, 104, 105, 203, 204, 205, 303, 304, 305]
    assert _sent(rp5, 12, 8, mode="async", inference_ms=250.0, blend="none") == switched
    blended = _sent(rp5, 12, 8, mode="async", inference_ms=250.0)
    seams = [0, 0, 0, 103, 104, 105, (2 * 106 + 203) / 3, (107 + 2 * 204) / 3, 205]
    seams += [(2 * 206 + 303) / 3, (207 + 2 * 304) / 3, 305]
    assert blended == pytest.approx(seams, abs=1e-3)


class _PlanningExpert:
    """The scripted IK expert as a chunking policy: its chunk is its own kinematic plan, ``L``
    expert steps rolled out from the measured joints (privileged: it reads the simulator)."""

    robot = "rp5"
    cameras: tuple[str, ...] = ()
    image_size, state_dim, action_dim = 32, 6, 6

    def __init__(self, env: BatchedEnv, rp5: RobotSpec, chunk_len: int) -> None:
        self.env, self.expert, self.chunk_len = env, ScriptedExpert(rp5), chunk_len

    def predict_chunk(self, obs: BatchedObservation) -> np.ndarray:
        truth = self.env.privileged()
        chunk = np.zeros((self.env.num_envs, self.chunk_len, 6), np.float32)
        chunk[:, :, -1] = GRIPPER_OPENING
        for e in range(self.env.num_envs):
            q = truth["arm_qpos"][e].copy()
            for i in range(self.chunk_len):
                chunk[e, i, :-1] = step = self.expert._joint_step(q, truth["target_pos"][e])
                q = q + step
        return chunk


def test_async_keeps_the_success_of_zero_delay_where_sync_loses_it(rp5: RobotSpec) -> None:
    """A competent chunking policy (the expert's own plan, chunk of 8) with a 250 ms inference
    (3 ticks at 10 Hz) on 25-tick episodes, success within 7 cm: async solves what zero delay
    solves; sync, holding 3 ticks for every action, runs out of time on many."""
    scene = SceneConfig(episode_steps=25, success=SuccessConfig(radius=0.07, hold_steps=1))
    seeds = list(range(100, 112))
    solved = {}
    for mode, ms in (("sync", 0.0), ("async", 250.0), ("sync", 250.0)):
        env = make_env(
            rp5, scene, SimConfig(num_threads=1), num_envs=6, cameras=(), autoreset=False
        )
        with env:
            policy = _PlanningExpert(env, rp5, 8)
            plan = delay_plan(DelayConfig(mode=mode, inference_ms=ms), rp5)  # type: ignore[arg-type]
            if plan is None:  # today's evaluation: the first action of a chunk every tick
                first = policy.predict_chunk
                records = play_episodes(env, lambda _, o: first(o)[:, 0], seeds)  # noqa: B023
            else:
                actor = DelayedActor(policy, check_plan(plan, policy, "expert"), rp5)
                records = play_episodes(env, actor.act, seeds, on_step=actor.on_step)
        solved[mode, ms] = sum(r.success for r in records)
    assert solved["sync", 0.0] == 12
    assert solved["async", 250.0] >= 10, solved  # 11 measured
    assert solved["sync", 250.0] <= 7, solved  # 6 measured


def test_the_evaluate_verb_refuses_a_delay_its_chunk_cannot_cover(
    moving_checkpoint: Path, robo_pipe_home: Path
) -> None:
    """``robo-pipe evaluate --delay-ms 250 --delay-mode async`` on a chunk of 3: the arithmetic,
    no traceback, before any episode; a delay with --baseline: refused (a usage error)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "ROBO_PIPE_HOME": str(robo_pipe_home), "COLUMNS": "200"}

    def robo_pipe(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pipelines.cli", "evaluate", str(moving_checkpoint)]
        tiny = ["--config", str(TINY_CONFIG), "--delay-ms", "250"]
        return subprocess.run(
            [*command, *tiny, *args], cwd=root, env=env, capture_output=True, text=True
        )

    refused = robo_pipe("--delay-mode", "async")
    shown = " ".join(refused.stderr.split())
    assert refused.returncode != 0 and "Traceback" not in shown, shown
    assert "a chunk of 3 actions x 100 ms = 300 ms cannot hold 10 Hz" in shown
    both = robo_pipe("--baseline", str(moving_checkpoint))
    assert both.returncode == 2 and "it takes no --baseline" in " ".join(both.stderr.split())


def test_the_device_delay_follows_the_profiles_loop() -> None:
    """A sync tick within its period plays no delay; past it, the robot holds (sync, no
    queue margin, the profile's execute); async plays the runtime's queue with its margin and
    blend."""
    from deploy_edge.targets import TargetProfile
    from stages.evaluate.at_delay import device_delay

    sync = TargetProfile(name="s", mode="sync", execute=2)
    assert device_delay(sync, 99.0, 100.0, DelayConfig()) is None
    held = device_delay(sync, 352.0, 100.0, DelayConfig())
    assert held is not None and (held.mode, held.inference_ms, held.margin_ms) == ("sync", 352.0, 0)
    assert held.execute == 2
    queued = TargetProfile(
        name="a", mode="async", action_age_budget_ms=600.0, inference_margin_ms=30.0, blend="none"
    )
    played = device_delay(queued, 1.5, 100.0, DelayConfig(latency_report="x.json"))
    assert played is not None and (played.mode, played.inference_ms) == ("async", 1.5)
    assert (played.margin_ms, played.blend, played.latency_report) == (30.0, "none", None)
    # The ticks played are the profile's own count, the one a device holds a release to.
    spec = get_robot("rp5")
    period_ms = 1000.0 / spec.control_hz
    for profile, inference_ms in [(sync, 352.0), (sync, 1.5 * period_ms), (queued, 1.5)]:
        delay = device_delay(profile, inference_ms, period_ms, DelayConfig())
        plan = delay_plan(delay, spec) if delay is not None else None
        assert plan is not None and plan.ticks == profile.delay_ticks(inference_ms, period_ms)
    assert sync.delay_ticks(period_ms, period_ms) == 0
