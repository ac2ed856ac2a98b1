"""The collect stage: demonstrations across Ray workers into a LeRobot v3 dataset.

    plan shards ──► workers (Ray actors, each a batched simulator + source) ──► committed shards
                                                                                      │
    DatasetRef ◄── content hash ◄── finalize (v3 layout, stats, provenance) ◄─────────┘

Seeds come from the run's ``collect`` seed stream, split into shards of consecutive seeds. A
worker that dies is restarted by Ray and its shard collected again (shards commit atomically: a
dead worker leaves no half of one in the dataset; the same seeds give the same episodes), up to
``collect.max_worker_restarts`` times per worker. A re-run of the same command finds the shards
already committed, collects only the missing ones and finalizes to the same bytes; with none
missing, a dataset already finalized from exactly those shards is returned untouched. A larger
``episodes`` appends shards to an existing dataset. Processes sharing a dataset take turns
(:mod:`robo_pipe.locks`): a second one waits, then reuses or extends what the first one left.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.integrity import IntegrityError
from robo_pipe.locks import StatusFn, output_lock
from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedObservation, StepResult
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.episodes import play_episodes
from sim_scenes.errors import SceneError
from sim_scenes.seeds import episode_seeds
from sim_scenes.tasks import resolve_task
from stages.collect.config import CollectConfig
from stages.collect.sources import make_source
from stages.dataset.layout import (
    INFO_PATH,
    PROVENANCE_PATH,
    STAGING_DIR,
    DatasetError,
    DatasetRef,
)
from stages.dataset.reader import dataset_ref
from stages.dataset.shards import (
    SHARD_MANIFEST,
    EpisodeBuffer,
    committed_shards,
    discard_uncommitted,
    write_shard,
)
from stages.dataset.writer import DatasetSchema, finalize
from stages.provenance import code_version
from stages.ray_runtime import node_id
from stages.worker_pool import PoolWorker

IDENTITY_FILE = "collection.json"
"""In ``.staging``: what this dataset is a collection of; appending must match it."""


@dataclass
class ShardResult:
    """What a worker reports for one committed shard (progress bars, benchmarks)."""

    start: int
    end: int
    attempted: int
    solved: int
    kept_frames: int
    timings: dict[str, float]
    pid: int
    """The process that collected it (a pool notices a restarted worker by it)."""
    node: str = ""
    """The Ray node it was collected on (``""``: in this process, ``workers: 0``)."""


class CollectWorker(PoolWorker):
    """One batched simulator plus a demonstration source; collects and commits shards.

    Runs in-process (``workers: 0``) or as a Ray actor (:func:`stages.worker_pool.restartable`).
    """

    def __init__(
        self,
        robot: str,
        scene: SceneConfig,
        sim: SimConfig,
        collect: CollectConfig,
        num_threads: int,
    ) -> None:
        self.robot = get_robot(robot)
        self.scene, self.collect = scene, collect
        self.env = make_env(
            self.robot,
            scene,
            sim.model_copy(update={"num_threads": num_threads}),
            num_envs=self.collect.envs_per_worker,
            autoreset=False,
        )
        self.task, _ = resolve_task(scene.variant)
        self.source = make_source(self.collect.source, self.robot, self.task)

    def collect_shard(self, start: int, end: int, seeds: list[int], staging: str) -> ShardResult:
        """Play ``seeds`` (the shard's), record every transition, commit the shard."""
        cameras = self.env.cameras
        fields = ("state", "action", "reward", "done", "success", "env_state", *cameras)
        buffers: dict[int, dict[str, list[Any]]] = {
            i: {f: [] for f in fields} for i in range(len(seeds))
        }
        source_time = 0.0
        # The task's privileged state (touch: the named object's centre) at the frame acted on.
        env_state = np.zeros((self.env.num_envs, len(self.task.env_state_names)), np.float32)

        # What the source chose (the dataset's action) at the frame acted on; the env is sent
        # it plus ``action_noise`` (drawn from the shard's first seed: a shard replays alike).
        chosen: list[np.ndarray] = []
        rng = np.random.default_rng([int(seeds[0]) if seeds else 0, 0x4441_5254])
        low, high = np.asarray(self.robot.action.low), np.asarray(self.robot.action.high)

        def act(env: Any, obs: BatchedObservation) -> np.ndarray:
            nonlocal source_time
            env_state[:] = self.task.env_state(env)
            t0 = time.perf_counter()
            actions = self.source(env, obs)
            source_time += time.perf_counter() - t0
            chosen[:] = [actions]
            if not self.collect.action_noise:
                return actions
            noise = rng.normal(0.0, self.collect.action_noise, actions.shape) * (high - low) / 2
            return np.clip(actions + noise, low, high).astype(actions.dtype)

        def record(
            slot: list[int], obs: BatchedObservation, actions: np.ndarray, r: StepResult
        ) -> None:
            for e, i in enumerate(slot):
                if i < 0:
                    continue
                buf = buffers[i]
                for cam in cameras:
                    buf[cam].append(obs.images[cam][e])
                buf["state"].append(obs.state[e])
                buf["env_state"].append(env_state[e].copy())
                buf["action"].append(chosen[0][e])
                buf["reward"].append(r.reward[e])
                buf["done"].append(bool(r.terminated[e] or r.truncated[e]))
                buf["success"].append(bool(r.success[e]))

        before = dict(self.env.timings)
        records = play_episodes(self.env, act, seeds, on_step=record)
        episodes = [
            EpisodeBuffer(
                seed=rec.seed,
                instruction=rec.instruction,
                images={cam: np.stack(buffers[rec.index][cam]) for cam in cameras},
                state=np.asarray(buffers[rec.index]["state"], np.float32),
                action=np.asarray(buffers[rec.index]["action"], np.float32),
                reward=np.asarray(buffers[rec.index]["reward"], np.float32),
                done=np.asarray(buffers[rec.index]["done"], bool),
                success=np.asarray(buffers[rec.index]["success"], bool),
                env_state=np.asarray(buffers[rec.index]["env_state"], np.float32),
            )
            for rec in records
        ]
        timings = {k: self.env.timings[k] - before[k] for k in before}
        timings["source"] = source_time
        manifest = write_shard(
            Path(staging),
            start,
            end,
            episodes,
            self.collect.keep_failed,
            self.robot.control_hz,
            self.collect.video_crf,
            timings,
            node_id(),
        )
        return ShardResult(
            start=start,
            end=end,
            attempted=len(episodes),
            solved=sum(ep.solved for ep in episodes),
            kept_frames=sum(e["length"] for e in manifest.kept),
            timings=manifest.timings,
            pid=os.getpid(),
            node=manifest.node,
        )

    def close(self) -> None:
        """Release the simulator."""
        self.env.close()


def _episodes_per_node(shards: list[Path]) -> dict[str, int]:
    """Attempted episodes per Ray node that collected them (``""``: not on Ray), from the
    committed shards' manifests (checked against their files by ``finalize``)."""
    nodes: dict[str, int] = {}
    for shard in shards:
        try:
            manifest = json.loads((shard / SHARD_MANIFEST).read_text())
            node, episodes = str(manifest.get("node", "")), len(manifest["episodes"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged manifest: finalize names it
        nodes[node] = nodes.get(node, 0) + episodes
    return nodes


def plan_shards(
    total: int, size: int, committed: set[tuple[int, int]]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Cover seed indices [0, total) with committed shards where they fit, new ones elsewhere.

    Returns (all shards in seed order, the new ones to collect). Committed shards reaching past
    ``total`` are kept: a dataset never shrinks.
    """
    starts = {s: e for s, e in committed}
    shards, new = [], []
    pos = 0
    while pos < total or pos in starts:
        if pos in starts:
            shards.append((pos, starts[pos]))
            pos = starts[pos]
            continue
        nxt = min([s for s in starts if s > pos], default=total)
        end = min(pos + size, total, nxt)
        shards.append((pos, end))
        new.append((pos, end))
        pos = end
    return shards, new


def _identity(
    robot: str, scene: SceneConfig, collect: CollectConfig, seed: int, fps: float
) -> dict[str, Any]:
    return {
        "robot": robot,
        "variant": scene.variant,
        "cameras": list(scene.cameras),
        "image_size": scene.image_size,
        "fps": fps,
        "root_seed": seed,
        "source": collect.source,
        "keep_failed": collect.keep_failed,
        # only when set: datasets collected before the field existed keep their identity
        **({"action_noise": collect.action_noise} if collect.action_noise else {}),
        "video_crf": collect.video_crf,
        **scene.task_overrides(),  # a stricter success or a shorter episode changes episodes
    }


def _check_output_dir(out: Path, identity: dict[str, Any]) -> None:
    """Refuse a directory that holds anything but this collection; nothing is touched."""
    ident_path = out / STAGING_DIR / IDENTITY_FILE
    if ident_path.is_file():
        existing = json.loads(ident_path.read_text())
        for field in ("robot", "variant"):
            if existing.get(field) != identity[field]:
                raise DatasetError(
                    f"{out}: cannot append: the dataset was collected with {field} "
                    f"{existing.get(field)!r}, this run uses {identity[field]!r}; "
                    "choose another --out"
                )
        diffs = [k for k in identity if existing.get(k) != identity[k]]
        if diffs:
            detail = ", ".join(f"{k}: {existing.get(k)!r} vs {identity[k]!r}" for k in diffs)
            raise DatasetError(f"{out}: holds a different dataset ({detail}); choose another --out")
        return
    if out.exists() and any(out.iterdir()):
        raise DatasetError(
            f"{out}: exists and holds other files (not a robo-pipe collection); "
            "choose an empty or new --out"
        )


def collect(
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    config: CollectConfig,
    seed: int,
    out: Path,
    ray_address: str | None = None,
    on_shard: Callable[[ShardResult], None] | None = None,
    extra_provenance: dict[str, Any] | None = None,
    on_status: StatusFn | None = None,
) -> DatasetRef:
    """Collect ``config.episodes`` demonstrations into the v3 dataset at ``out``.

    Under ``out``'s inter-process lock (:func:`robo_pipe.locks.output_lock`): a collection
    another process is running is waited for and then reused (or resumed, if that process
    died); ``on_status`` gets a line saying so, one when the dataset is reused as it is, and
    one for each worker that died and was restarted (which shard it collected again).

    Raises:
        DatasetError: ``out`` holds other files or a different collection, or a committed shard
            is corrupt.
        SceneError: ``scene.variant`` is held out for evaluation.
        WorkersDiedError: a worker died more than ``config.max_worker_restarts`` times.
    """
    family, _ = resolve_task(scene.variant)
    variant = scene.task()
    if variant.split != "train":
        raise SceneError(
            f"scene variant {scene.variant!r} is held out for evaluation; collect from a training "
            f"variant ({variant.holdout_for or 'see robo-pipe scenes'})"
        )
    spec = get_robot(robot)
    identity = _identity(robot, scene, config, seed, spec.control_hz)
    out = Path(out).resolve()
    # One collector per dataset at a time; a run that waited here finds what the other committed.
    with output_lock(out, "collect", on_status):
        _check_output_dir(out, identity)
        staging = out / STAGING_DIR
        staging.mkdir(parents=True, exist_ok=True)
        if not (staging / IDENTITY_FILE).is_file():  # if there, it is this one (checked above)
            (staging / IDENTITY_FILE).write_text(json.dumps(identity, indent=1))
        discard_uncommitted(out)  # only the lock's holder writes shards: these are a dead run's

        seeds = episode_seeds(seed, config.episodes, "collect")
        committed = committed_shards(out)
        shards, todo = plan_shards(config.episodes, config.episodes_per_shard, set(committed))
        if not todo and _finalized_from(out, [committed[s].name for s in shards]):
            # Finalizing again would rewrite files another run may be reading right now, so a
            # finished dataset that verifies is returned as it is; one that does not (a flipped
            # byte, a lost file) is finalized again from its committed shards, which are the
            # source of truth and carry their own manifests.
            try:
                ref = dataset_ref(out, robot, scene.variant, config.source)
            except (DatasetError, IntegrityError) as err:
                if on_status:
                    on_status(f"the dataset at {out} fails its checks ({err}); rebuilding it")
            else:
                if on_status:
                    on_status(f"reusing the dataset at {out}: all {len(shards)} shards collected")
                return ref
        if on_status and todo and len(todo) < len(shards):
            on_status(
                f"{len(shards) - len(todo)} of {len(shards)} shards already committed; "
                f"collecting the other {len(todo)}"
            )
        if shards[-1][1] > len(seeds):  # committed shards beyond this run's count
            seeds = episode_seeds(seed, shards[-1][1], "collect")
        args = (robot, scene, sim, config)
        if todo:
            _run_shards(todo, seeds, staging, args, config, sim, ray_address, on_shard, on_status)

        paths = committed_shards(out)
        schema = DatasetSchema(
            robot=robot,
            fps=spec.control_hz,
            state_names=spec.state_names,
            action_names=spec.action.names,
            cameras=tuple(scene.cameras),
            image_size=scene.image_size,
            crf=config.video_crf,
            env_state_names=family.env_state_names,
        )
        provenance = {
            "collection": identity,
            "collect": config.model_dump(),
            "seed_stream": "collect",
            "code_version": code_version(),
            **(extra_provenance or {}),
            "shards": [paths[s].name for s in shards],  # what a later run may reuse it as
            "collected_on": _episodes_per_node([paths[s] for s in shards]),
        }
        finalize(out, [paths[s] for s in shards], schema, provenance)
        return dataset_ref(out, robot, scene.variant, config.source)


def _finalized_from(out: Path, shards: list[str]) -> bool:
    """Whether ``out`` is a finished dataset finalized from exactly ``shards`` (names, in order).

    ``finalize`` swaps a complete new tree in at once, so the provenance beside ``info.json``
    is always that of the dataset there.
    """
    if not (out / INFO_PATH).is_file():
        return False
    try:
        provenance = json.loads((out / PROVENANCE_PATH).read_text())
    except (OSError, ValueError):
        return False
    return bool(provenance.get("shards") == shards)


def _run_shards(
    todo: list[tuple[int, int]],
    seeds: list[int],
    staging: Path,
    args: tuple[str, SceneConfig, SimConfig, CollectConfig],
    config: CollectConfig,
    sim: SimConfig,
    ray_address: str | None,
    on_shard: Callable[[ShardResult], None] | None,
    on_status: StatusFn | None,
) -> None:
    """Collect and commit the ``todo`` shards: in this process, or on restartable Ray actors."""
    jobs = [(s, e, seeds[s:e], str(staging)) for s, e in todo]
    if config.workers == 0:
        worker = CollectWorker(*args, num_threads=sim.num_threads)
        try:
            for job in jobs:
                result = worker.collect_shard(*job)
                if on_shard:
                    on_shard(result)
        finally:
            worker.close()
        return

    from stages.ray_runtime import init_ray
    from stages.worker_pool import WorkerPool, restartable

    init_ray(ray_address, num_cpus=None)  # before `import ray`: it picks the network address
    remote_worker = restartable(CollectWorker, 1, config.max_worker_restarts)
    pool = WorkerPool(
        lambda _: remote_worker.remote(*args, num_threads=1),
        min(config.workers, len(jobs)),
        "collect worker",
        "collect.max_worker_restarts",
        config.max_worker_restarts,
        on_status,
    )
    try:
        for _, result in pool.map_unordered(
            jobs,
            lambda w, job: w.collect_shard.remote(*job),
            lambda job: f"shard {job[0]}-{job[1]}",
        ):
            if on_shard:
                on_shard(result)
    finally:
        pool.close()
