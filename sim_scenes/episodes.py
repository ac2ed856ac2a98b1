"""Play a fixed list of seeded episodes on a batched env with any acting function.

Each environment takes the next pending seed as soon as its episode ends, so N environments
work through the list in parallel and the outcome of every seed is independent of N: the same
seeds give the same per-episode results whatever the batch size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sim_scenes.batched_env import BatchedEnv, BatchedObservation, StepResult

ActFn = Callable[[BatchedEnv, BatchedObservation], np.ndarray]
"""Maps (env, observation) to actions of shape ``(N, action_dim)``."""
StepFn = Callable[[list[int], BatchedObservation, np.ndarray, StepResult], None]
"""Called after every step with (seed index per env or -1 if idle, the observation the actions
were chosen from, the actions, the step result): everything needed to record transitions."""


@dataclass
class EpisodeRecord:
    """Outcome of one seeded episode."""

    index: int
    """Position of the episode's seed in the ``seeds`` list."""
    seed: int
    success: bool
    length: int
    """Control steps."""
    episode_return: float
    instruction: str
    frames: list[np.ndarray] = field(default_factory=list)
    """Camera frames (uint8 HWC) per step, for recorded episodes only."""
    closest_target_distance: float = math.nan
    """m: the tool centre point's closest approach to the named object's centre over the
    episode (nan: the backend does not report distances)."""
    closest_distractor_distance: float = math.nan
    """m: its closest approach to any other object's centre (inf: no other object)."""
    final_target_distance: float = math.nan
    """m: tool centre point to the named object's centre after the episode's last step."""


def play_episodes(
    env: BatchedEnv,
    act: ActFn,
    seeds: Sequence[int],
    *,
    record: int = 0,
    record_camera: str | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    on_step: StepFn | None = None,
) -> list[EpisodeRecord]:
    """Play one episode per seed; return records in the order of ``seeds``.

    Args:
        env: an environment created with ``autoreset=False``.
        act: the acting function (scripted expert, policy, ...).
        seeds: episode seeds; may be more or fewer than ``env.num_envs``.
        record: keep the frames of the first ``record`` seeds (first camera unless
            ``record_camera`` is given).
        on_episode: called as each episode finishes (for progress bars).
        on_step: called after every step (for recording transitions, see :data:`StepFn`).
    """
    if not seeds:
        return []
    camera = record_camera or (env.cameras[0] if env.cameras else None)
    n = env.num_envs
    pending = deque(range(len(seeds)))
    # slot[e]: index into seeds of the episode env e is playing; -1 = idle. Idle envs still
    # step with the batch, replaying seeds[0], and their results are discarded.
    slot = [pending.popleft() if pending else -1 for _ in range(n)]
    obs = env.reset([int(seeds[i]) if i >= 0 else int(seeds[0]) for i in slot])
    records: dict[int, EpisodeRecord] = {}
    instructions = {i: obs.instruction[e] for e, i in enumerate(slot) if i >= 0}
    frames: dict[int, list[np.ndarray]] = {i: [] for i in range(min(record, len(seeds)))}

    def keep_frames(o: BatchedObservation, envs: Sequence[int]) -> None:
        if camera is None:
            return
        for e in envs:
            if slot[e] in frames:
                frames[slot[e]].append(o.images[camera][e].copy())

    keep_frames(obs, range(n))
    # seed index -> (closest target, closest distractor, latest target), m; keyed by episode,
    # not env, so an env that restarts starts its new episode's minimum afresh
    distances: dict[int, tuple[float, float, float]] = {}
    unreported = (math.nan, math.nan, math.nan)  # a backend that reports no distances
    while len(records) < len(seeds):
        actions = act(env, obs)
        result = env.step(actions)
        if on_step is not None:
            on_step(list(slot), obs, actions, result)
        if "tcp_target_distance" in result.info:  # a backend that reports distances
            target = result.info["tcp_target_distance"]
            distractor = result.info.get("tcp_distractor_distance", np.full(n, np.nan))
            for e, i in enumerate(slot):
                if i >= 0:
                    was = distances.get(i, (math.inf, math.inf, math.nan))
                    distances[i] = (
                        _closer(was[0], target[e]),
                        _closer(was[1], distractor[e]),
                        float(target[e]),
                    )
        obs = result.obs
        keep_frames(obs, range(n))  # for envs that just finished: their episode's last frame
        restart_envs, restart_seeds = [], []
        for k, e in enumerate(result.final.env_ids):
            i = slot[e]
            if i >= 0:
                closest_target, closest_distractor, final_target = distances.pop(i, unreported)
                rec = EpisodeRecord(
                    index=i,
                    seed=int(seeds[i]),
                    success=bool(result.final.success[k]),
                    length=int(result.final.length[k]),
                    episode_return=float(result.final.episode_return[k]),
                    instruction=instructions[i],
                    frames=frames.pop(i, []),
                    closest_target_distance=closest_target,
                    closest_distractor_distance=closest_distractor,
                    final_target_distance=final_target,
                )
                records[i] = rec
                if on_episode is not None:
                    on_episode(rec)
            slot[e] = pending.popleft() if pending else -1
            restart_envs.append(int(e))
            restart_seeds.append(int(seeds[slot[e]]) if slot[e] >= 0 else int(seeds[0]))
        if restart_envs:
            obs = env.reset_envs(restart_envs, restart_seeds)
            for e in restart_envs:
                if slot[e] >= 0:
                    instructions[slot[e]] = obs.instruction[e]
            keep_frames(obs, restart_envs)
    return [records[i] for i in range(len(seeds))]


def _closer(a: float, b: float) -> float:
    """The smaller distance; nan (not reported) stays nan."""
    return math.nan if math.isnan(a) or math.isnan(b) else min(a, float(b))
