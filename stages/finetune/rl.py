"""RL fine-tuning on Ray: rollout-worker actors and one learner actor, LoRA-only weight sync.

    learner  = Learner actor (policy, frozen start policy, the algorithm, optimizer state)
    workers  = N RolloutWorker actors (batched simulator + policy copy, inference only)
    for iteration in start..iterations:
        rollouts = every worker plays its round with the synced weights: steps_per_env
                   decisions (groups: groups_per_worker groups of group_size whole episodes,
                   each group from one reset seed drawn for this iteration and worker)
        update   = learner trains on them                         (replay: overlapped with
                                                                   the next round's rollouts)
        sync     = learner's trainable weights -> object store -> every worker
        every checkpoint_every: learner checkpoint (a re-run resumes from the latest)

What the algorithm is (:mod:`stages.finetune.algorithm`: on-policy or replay, groups, a value
head in the workers) comes from its class; nothing here names one.

Both actors are plain classes (:mod:`stages.finetune.rollout`, :mod:`stages.finetune.learner`)
that Ray restarts when their process dies, up to ``rl.max_worker_restarts`` times each. A
restarted rollout worker plays its rollout again (the call carries the weights to play with);
a restarted learner is back at its last checkpoint, so the loop goes back there too and does
the iterations since again. Each iteration appends a record to ``metrics.jsonl`` (success of
the episodes finished in the round, return, losses, seconds in rollout / learning / sync, bytes
per sync, restarts) and the run ends by drawing ``learning_curves.png``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.locks import StatusFn
from sim_scenes.config import SceneConfig, SimConfig
from stages.finetune.algorithm import algorithm_class
from stages.finetune.checkpoints import latest_checkpoint, log_metrics, read_metrics
from stages.finetune.config import RLConfig
from stages.finetune.learner import Learner
from stages.finetune.rollout import RolloutWorker
from stages.finetune.rounds import GroupRollout, Rollout
from stages.ray_runtime import RayClusterError
from stages.worker_pool import WorkerPool, WorkersDiedError, restartable

CURVES_FILE = "learning_curves.png"
ROLLING_EPISODES = 100
"""Episodes the plotted training success averages over."""
LIMIT = "finetune.rl.max_worker_restarts"
"""The config field that bounds the restarts of every RL actor."""


@dataclass
class RLJob:
    """Everything an RL run needs (its configs sent as they are to the learner and the rollout
    workers)."""

    out: str
    """Run directory: ``step-XXXXXXX`` learner checkpoints, ``metrics.jsonl``, curves."""
    start_checkpoint: str
    """The policy RL starts from (the BC fine-tune, or the base with fresh adapters)."""
    algo: str
    """The RL algorithm's name (:data:`stages.finetune.algorithm.ALGORITHMS`)."""
    robot: str
    scene: SceneConfig
    sim: SimConfig
    rl: RLConfig
    seed: int
    lineage: dict[str, Any] = field(default_factory=dict)


@dataclass
class RLRun:
    """The live actors of a run (what ``on_iteration`` callbacks see)."""

    learner: Any
    iteration: int = 0
    weights: Any = None
    """The synced weights of ``iteration`` (an object-store reference) rollouts play with."""
    learner_restarts: int = 0
    """Times the learner died and was restarted from its last checkpoint."""
    pool: WorkerPool = field(init=False)
    """The rollout workers."""

    @property
    def workers(self) -> list[Any]:
        """The rollout-worker actors, by slot."""
        return self.pool.workers

    @property
    def replacements(self) -> int:
        """Rollout workers that died and were restarted."""
        return self.pool.restarts


class _LearnerRestarted(Exception):
    """The learner died and Ray restarted it at its last checkpoint (caught in train_rl)."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__(f"the learner restarted at iteration {state['iteration']}")
        self.state = state


def train_rl(
    job: RLJob,
    ray_address: str | None = None,
    on_iteration: Callable[[RLRun], None] | None = None,
    on_status: StatusFn | None = None,
) -> Path:
    """Run (or resume) RL fine-tuning to ``rl.iterations``; returns the final checkpoint.

    ``on_status`` gets a line for each actor that died and was restarted, and what was done
    again.

    Raises:
        RayClusterError: the cluster has fewer CPUs than the actors ask for.
        WorkersDiedError: an actor died more than ``rl.max_worker_restarts`` times; re-running
            resumes from the learner's last checkpoint.
    """
    from stages.ray_runtime import init_ray

    init_ray(ray_address)  # before importing ray (see stages/ray_runtime.py)
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    cfg = job.rl
    algorithm = algorithm_class(job.algo)
    settings = cfg.settings(job.algo)
    off_policy = not algorithm.on_policy
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = cfg.learner_cpus + cfg.workers * cfg.worker_cpus
    available = float(ray.cluster_resources().get("CPU", 0.0))
    if wanted > available:  # Ray would wait for the missing CPUs forever
        raise RayClusterError(
            f"finetune.rl asks for {wanted:g} CPUs (learner_cpus {cfg.learner_cpus:g} + "
            f"workers {cfg.workers} x worker_cpus {cfg.worker_cpus:g}) but the Ray cluster has "
            f"{available:g}: lower them, or pass --ray-address of a larger cluster"
        )
    # The learner's calls are not run again by Ray (no max_task_retries): a restarted learner
    # is at its last checkpoint, not where the call was made, so this loop goes back there.
    learner_cls: Any = ray.remote(num_cpus=cfg.learner_cpus, max_restarts=cfg.max_worker_restarts)(
        Learner
    )
    worker_cls = restartable(RolloutWorker, cfg.worker_cpus, cfg.max_worker_restarts)
    threads = max(1, int(cfg.worker_cpus))
    learner = learner_cls.remote(job.start_checkpoint, job.algo, job.rl, job.seed, job.out)
    # Waits out a restart should the learner die while starting (it starts the same way again).
    sizes = ray.get(learner.state.options(max_task_retries=-1).remote())
    learner_pid = sizes["pid"]
    run = RLRun(learner, iteration=sizes["iteration"])

    def new_worker(slot: int) -> Any:
        return worker_cls.remote(
            job.start_checkpoint,
            job.robot,
            job.scene,
            job.sim,
            cfg.envs_per_worker,
            cfg.horizon,
            cfg.gamma,
            job.seed + 1000 * run.iteration,
            slot,
            threads,
            **algorithm.worker_kinds(settings),
        )

    def learner_call(ref: Any) -> Any:
        """``ray.get`` of a learner call; a learner that died raises :class:`_LearnerRestarted`
        once Ray has restarted it, or :class:`WorkersDiedError` when Ray gave up on it."""
        try:
            return ray.get(ref)
        except RayActorError as err:
            if isinstance(err, RayTaskError) or err.actor_init_failed:
                raise  # its own code failed: not a death
            try:  # waits for the restart to finish
                state = ray.get(learner.state.options(max_task_retries=-1).remote())
            except RayActorError:
                deaths = cfg.max_worker_restarts + 1
                raise WorkersDiedError(
                    f"the RL learner died {deaths} time{'s' * (deaths > 1)}, the last time at "
                    f"iteration {run.iteration}: Ray restarts it at most {LIMIT} = "
                    f"{cfg.max_worker_restarts} times. Raise {LIMIT} to allow more, or find what "
                    f"kills it (out of memory?); re-running resumes from its last checkpoint "
                    f"under {out}"
                ) from err
            raise _LearnerRestarted(state) from err

    def fetch_weights() -> Any:
        """The learner's current trainable weights in the object store. Fetched here once, so
        that a dead learner is noticed by this loop rather than by the workers reading them."""
        weights = learner.weights.remote()
        learner_call(weights)
        return weights

    def sync() -> float:
        tick = time.perf_counter()
        run.weights = fetch_weights()  # stays in the object store; workers read it there
        loads = run.pool.call_each(lambda w: w.set_weights.remote(run.weights, run.iteration))
        run.pool.gather(loads, f"its weight sync of iteration {run.iteration}")
        return time.perf_counter() - tick

    def sync_async() -> float:
        """Off-policy sync: queue the new weights behind each worker's running rollout (they
        take effect for its next one) without waiting for it to finish."""
        tick = time.perf_counter()
        run.weights = fetch_weights()
        for worker in run.workers:
            worker.set_weights.remote(run.weights, run.iteration)
        return time.perf_counter() - tick

    def launch() -> list[Any]:
        weights, version = run.weights, run.iteration
        return [
            algorithm.start_round(worker, settings, job.seed, version, slot, weights)
            for slot, worker in enumerate(run.workers)
        ]

    def out_of_rounds(done: int) -> bool:
        """No round follows the one that leaves ``done`` iterations done: the last iteration,
        or the time budget is spent."""
        budget = cfg.time_budget_s
        return done >= cfg.iterations or (
            budget is not None and time.perf_counter() - start_time > budget
        )

    run.pool = WorkerPool(
        new_worker, cfg.workers, "RL rollout worker", LIMIT, cfg.max_worker_restarts, on_status
    )
    start_time = time.perf_counter()
    env_steps = _logged(out, "env_steps", run.iteration)
    pending: list[Any] = []
    try:
        while run.iteration < cfg.iterations:
            try:
                if not pending:  # the first round, or the first since the learner restarted
                    run.weights = fetch_weights()
                    pending = launch()
                tick = time.perf_counter()
                rollouts: list[Rollout | GroupRollout] = run.pool.gather(
                    pending, f"its rollout of iteration {run.iteration + 1}"
                )
                pending = []
                rollout_s = time.perf_counter() - tick
                tick = time.perf_counter()
                update = learner.update.remote(rollouts)
                # The next round is launched only if it will be used: one left running at the
                # end would be killed with the workers (and Ray would say so, loudly).
                if off_policy and not out_of_rounds(run.iteration + 1):
                    pending = launch()  # it plays while the learner trains on this round
                metrics = learner_call(update)
                learn_s = time.perf_counter() - tick
                run.iteration += 1
                last = out_of_rounds(run.iteration)
                sync_s = sync_async() if off_policy else sync()
                if not off_policy and not last:
                    pending = launch()
                round_steps = sum(r.env_steps for r in rollouts)
                env_steps += round_steps
                wall = rollout_s + learn_s + sync_s
                success = [bool(s) for r in rollouts for s in r.success]
                record = {
                    "step": run.iteration,
                    "env_steps": env_steps,
                    "episodes": len(success),
                    "success_rate": float(np.mean(success)) if success else float("nan"),
                    "return_mean": float(np.mean([x for r in rollouts for x in r.episode_return]))
                    if success
                    else float("nan"),
                    **metrics,
                    "rollout_s": rollout_s,
                    "learn_s": learn_s,
                    "sync_s": sync_s,
                    "env_steps_per_s": round_steps / wall,
                    "updates_per_s": metrics.get("updates", 0.0) / wall,
                    "simulate_s": max(r.seconds["simulate"] for r in rollouts),
                    "inference_s": max(r.seconds["inference"] for r in rollouts),
                    "sync_bytes": sizes["sync_bytes"],
                    "full_model_bytes": sizes["full_model_bytes"],
                    "replacements": run.replacements,
                    "learner_restarts": run.learner_restarts,
                    "time": time.time(),
                }
                log_metrics(out, record)
                if on_iteration:
                    on_iteration(run)
                if (
                    run.iteration % cfg.checkpoint_every == 0 or last
                ):  # last: what was trained is kept
                    learner_call(learner.checkpoint.remote(job.lineage))
                if last:
                    break
            except _LearnerRestarted as restarted:
                # The round played for the lost iterations (SAC's next one) is dropped.
                if pending:
                    run.pool.gather(pending, "its dropped rollout")
                pending = []
                back_to = restarted.state["iteration"]
                run.learner_restarts += 1
                if on_status:
                    since = f"its checkpoint of iteration {back_to}" if back_to else "the start"
                    again = ""
                    if run.iteration == back_to + 1:
                        again = f"; iteration {run.iteration} is done again"
                    elif run.iteration > back_to:
                        again = f"; iterations {back_to + 1}-{run.iteration} are done again"
                    on_status(
                        f"RL learner (pid {learner_pid}) died after iteration {run.iteration}; "
                        f"restarted as pid {restarted.state['pid']} from {since}{again}"
                    )
                learner_pid = restarted.state["pid"]
                run.iteration = back_to
                env_steps = _logged(out, "env_steps", back_to)
    finally:
        run.pool.close()
        ray.kill(learner)
    plot_learning_curves(out, job.algo, algorithm.loss_metrics)
    latest = latest_checkpoint(out)
    assert latest is not None
    return latest


def _logged(out: Path, key: str, step: int) -> int:
    """``key`` of the metrics record of iteration ``step`` (0 before the first)."""
    records = [r for r in read_metrics(out) if r["step"] == step]
    return int(records[0].get(key, 0)) if records else 0


def rolling_success(records: list[dict[str, Any]]) -> list[float]:
    """Success of the training episodes that ended in the rounds up to each record, over at
    least the last ``ROLLING_EPISODES`` of them (a round ends only a few episodes)."""
    rates = []
    for i in range(len(records)):
        solved = episodes = 0.0
        for r in reversed(records[: i + 1]):
            if r["episodes"]:
                solved += r["success_rate"] * r["episodes"]
                episodes += r["episodes"]
            if episodes >= ROLLING_EPISODES:
                break
        rates.append(solved / episodes if episodes else float("nan"))
    return rates


def plot_learning_curves(out: Path, algo: str, losses: tuple[str, ...]) -> Path | None:
    """Success rate and return of the training episodes, and the ``losses`` of algorithm
    ``algo``'s updates, against env steps."""
    records = read_metrics(out)
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["env_steps"] for r in records]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(steps, [r["success_rate"] for r in records], ".", alpha=0.3, label="per round")
    axes[0].plot(steps, rolling_success(records), label=f"last {ROLLING_EPISODES} episodes")
    axes[0].set(title="training-episode success", xlabel="env steps", ylim=(-0.02, 1.02))
    axes[0].legend(fontsize=8)
    axes[1].plot(steps, [r["return_mean"] for r in records], marker=".")
    axes[1].set(title="episode return", xlabel="env steps")
    for key in dict.fromkeys(losses):
        points = [(s, r[key]) for s, r in zip(steps, records, strict=True) if key in r]
        if points:
            axes[2].plot(*zip(*points, strict=True), label=key)
    axes[2].set(title=f"{algo.upper()} losses", xlabel="env steps")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    path = out / CURVES_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
