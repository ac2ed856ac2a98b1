"""Play a fixed list of seeded episodes on a batched env with any acting function.

Each environment takes the next pending seed as soon as its episode ends, so N environments
work through the list in parallel and the outcome of every seed is independent of N: the same
seeds give the same per-episode results whatever the batch size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sim_scenes.batched_env import BatchedEnv, BatchedObservation, StepResult
from sim_scenes.tasks import EpisodeSignal

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
    signals: dict[str, float] = field(default_factory=dict)
    """The episode's values of the ``signals`` :func:`play_episodes` was asked for, by name
    (one the backend does not report is left out)."""


def play_episodes(
    env: BatchedEnv,
    act: ActFn,
    seeds: Sequence[int],
    *,
    record: int = 0,
    record_camera: str | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    on_step: StepFn | None = None,
    signals: Mapping[str, EpisodeSignal] | None = None,
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
        signals: per-step ``info`` values to reduce over each episode, by name (a task
            family's :attr:`~sim_scenes.tasks.TaskFamily.episode_signals`).
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
    # seed index -> signal name -> value so far; keyed by episode, not env, so an env that
    # restarts starts its new episode's values afresh
    reduced: dict[int, dict[str, float]] = {}
    while len(records) < len(seeds):
        actions = act(env, obs)
        result = env.step(actions)
        if on_step is not None:
            on_step(list(slot), obs, actions, result)
        for name, signal in (signals or {}).items():
            if signal.key not in result.info:  # a backend that does not report it
                continue
            values = result.info[signal.key]
            for e, i in enumerate(slot):
                if i >= 0:
                    episode = reduced.setdefault(i, {})
                    episode[name] = _reduce(signal.reduce, episode.get(name), float(values[e]))
        obs = result.obs
        keep_frames(obs, range(n))  # for envs that just finished: their episode's last frame
        restart_envs, restart_seeds = [], []
        for k, e in enumerate(result.final.env_ids):
            i = slot[e]
            if i >= 0:
                rec = EpisodeRecord(
                    index=i,
                    seed=int(seeds[i]),
                    success=bool(result.final.success[k]),
                    length=int(result.final.length[k]),
                    episode_return=float(result.final.episode_return[k]),
                    instruction=instructions[i],
                    frames=frames.pop(i, []),
                    signals=reduced.pop(i, {}),
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


def _reduce(how: str, so_far: float | None, value: float) -> float:
    """``so_far`` (None before the episode's first step) updated with this step's ``value``:
    ``min``/``max`` (nan, not reported, stays nan) or ``last``."""
    if how == "last" or so_far is None:
        return value
    if math.isnan(so_far) or math.isnan(value):
        return math.nan
    return min(so_far, value) if how == "min" else max(so_far, value)
