"""The training stages: datasets (or a simulator) in, a ``CheckpointRef`` out, training on Ray.

``pretrain``: collect demonstrations on the task family (every training variant except the
target), then train the full default VLA on them. Cached under
``$ROBO_PIPE_HOME/checkpoints/base-<key>`` where the key hashes everything that determines the
result (robot, cameras, policy, pretraining config, seed): later runs reuse it.

``finetune``: freeze that base and train LoRA adapters + heads (or everything, with
``trainable: all``) on the target task's dataset; a ``hub-vlm`` policy starts from its
pretrained backbone instead. Output under ``$ROBO_PIPE_HOME/checkpoints/<name>-finetune-<key>``.

``rl_finetune``: PPO, SAC or GRPO in simulation from a BC fine-tune (or the base with fresh
adapters), with rollout-worker and learner actors (:mod:`stages.finetune.rl`).

``pretrain`` and ``finetune`` run :func:`stages.finetune.bc.train_bc` on ``bc.workers`` Ray
Train workers (DDP over gloo when more than one; ``workers: 0`` runs in this process).
Re-running an interrupted stage with the same inputs resumes from its latest checkpoint; a
finished one returns its record at once. Each trains under its output directory's inter-process
lock (:mod:`robo_pipe.locks`): a second run of the same inputs waits, then reuses the first
one's record, or resumes its checkpoints if that process died.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from robo_pipe.home import mark_home, unmark_home
from robo_pipe.locks import StatusFn, output_lock
from robo_pipe.names import slug
from robots.spec import get_robot
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.tasks import DEFAULT_FAMILY, resolve_task, split_task_name, task_name
from stages.collect.config import CollectConfig
from stages.collect.run import ShardResult, collect
from stages.dataset.layout import DatasetError, DatasetRef
from stages.finetune.algorithm import ALGORITHMS
from stages.finetune.bc import BCJob, train_bc
from stages.finetune.checkpoints import latest_checkpoint, read_metrics
from stages.finetune.config import BCConfig, FinetuneConfig, PretrainConfig
from stages.finetune.ray_train import (
    WORKERS_DIR,
    MetricsFn,
    fit_on_ray_train,
    forwarding_metrics,
)
from stages.policy.checkpoint import (
    CheckpointError,
    CheckpointRef,
    checkpoint_hash,
    load_policy,
    read_policy_meta,
    save_policy,
)
from stages.policy.config import LoraSettings, PolicyConfig, VLAConfig
from stages.policy.types import CHECKPOINT_BASE, BaseRef, policy_type
from stages.provenance import code_version

REF_FILE = "checkpoint_ref.json"
"""Written when a training run finishes: its :class:`CheckpointRef`."""

CollectedFn = Callable[[int, int], None]  # pretraining's demonstrations (done, total)


def _key(*parts: Any) -> str:
    canonical = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def pretrain_variants(target: str, config: PretrainConfig) -> list[str]:
    """The variants a base is pretrained on: configured, or the task family's own choice for
    ``target`` (touch: every training variant but ``target``)."""
    family, name = resolve_task(target)
    default = [task_name(family, variant) for variant in family.pretrain_variants(name)]
    variants = config.variants or default
    if target in variants:
        raise ValueError(f"pretrain.variants includes the target variant {target!r}")
    return variants


def pretrain(
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    collect_config: CollectConfig,
    policy: PolicyConfig,
    config: PretrainConfig,
    seed: int,
    checkpoints_dir: Path,
    datasets_dir: Path,
    ray_address: str | None = None,
    on_metrics: MetricsFn | None = None,
    on_status: StatusFn | None = None,
    on_collected: CollectedFn | None = None,
) -> CheckpointRef:
    """Pretrain (or reuse) the base model for target variant ``scene.variant``; its
    demonstrations go under ``datasets_dir``, the base under ``checkpoints_dir``. ``on_status``
    gets progress lines, and one when this waits for, takes over or reuses another run's;
    ``on_collected`` counts the demonstrations (the demo's 3,000 take minutes), then
    ``on_metrics`` the training steps."""
    if not policy_type(policy.type).needs_pretraining:
        raise ValueError(f"pretrain builds the default VLA; policy.type is {policy.type!r}")
    variants = pretrain_variants(scene.variant, config)
    spec = get_robot(robot)
    # A base is never delay-conditioned (its fine-tunes are, on their own data): one base
    # serves both.
    policy = policy.model_copy(update={"prefix_ticks": 0})
    key = _key(robot, scene.cameras, scene.image_size, policy, config, variants, seed)
    out = checkpoints_dir / f"base-{key}"
    with output_lock(out, "pretrain", on_status):  # one trainer per directory
        cached = _finished(out, on_status)  # another run may have finished it while we waited
        if cached is not None:
            return cached
        datasets = []
        total = config.episodes_per_variant * len(variants)
        for i, variant in enumerate(variants):
            if on_status:
                on_status(f"collecting {config.episodes_per_variant} demonstrations on {variant}")
            before = i * config.episodes_per_variant
            counted = _shard_counter(before, total, on_collected)
            ref = collect(
                robot,
                scene.model_copy(update={"variant": variant}),
                sim,
                collect_config.model_copy(update={"episodes": config.episodes_per_variant}),
                seed,
                datasets_dir / f"pretrain-{slug(variant)}-{key}",
                ray_address,
                on_shard=counted,
                on_status=on_status,
            )
            datasets.append(ref.path)
        if on_collected:
            on_collected(total, total)
        job = BCJob(
            out=str(out),
            datasets=datasets,
            bc=config.bc,
            seed=seed,
            trainable="all",
            policy=policy,
            cameras=list(scene.cameras),
            image_size=scene.image_size,
            robot=spec.name,
            task=split_task_name(scene.variant)[0],
            state_dim=len(spec.state_names),
            action_dim=spec.action.dim,
            lineage={
                "stage": "pretrain",
                "variants": variants,
                "config": {
                    "robot": robot,
                    "scene": scene.model_dump(),
                    "collect": collect_config.model_dump(),
                    "policy": policy.model_dump(),
                    "pretrain": config.model_dump(),
                },
                "config_hash": key,
                "code_version": code_version(),
            },
        )
        if on_status:
            on_status(f"pretraining the base on {', '.join(variants)}")
        return _train(job, config.bc, ray_address, on_metrics)


def _shard_counter(
    before: int, total: int, on_collected: CollectedFn | None
) -> Callable[[ShardResult], None] | None:
    """A variant's ``on_shard`` for :func:`pretrain`: (collected, total), ``before`` of them
    from the variants collected earlier."""
    if on_collected is None:
        return None
    done = before

    def counted(shard: ShardResult) -> None:
        nonlocal done
        done += shard.attempted
        on_collected(min(done, total), total)

    return counted


def finetune(
    dataset: DatasetRef | str | Path,
    policy: PolicyConfig,
    config: FinetuneConfig,
    base: CheckpointRef | None,
    seed: int,
    checkpoints_dir: Path,
    name: str = "policy",
    ray_address: str | None = None,
    on_metrics: MetricsFn | None = None,
    lineage: dict[str, Any] | None = None,
    on_status: StatusFn | None = None,
    task: str = DEFAULT_FAMILY,
) -> CheckpointRef:
    """Fine-tune on ``dataset``: from ``base`` (the default VLA's pretrained checkpoint) or,
    for a type that needs no pretraining (``hub-vlm``, ``pretrained``), from its frozen base
    (``base`` must be None), a new policy for the task family ``task``.
    ``on_status``: a line when this waits for, takes over or reuses another run's training."""
    path = Path(dataset.path if isinstance(dataset, DatasetRef) else dataset).resolve()
    from stages.dataset.reader import open_dataset

    data = open_dataset(path, check_videos=False)
    if policy_type(policy.type).needs_pretraining and base is None:
        raise ValueError("fine-tuning the default VLA needs a pretrained base (run pretrain)")
    if base is not None and checkpoint_hash(base.path) != base.content_hash:
        raise CheckpointError(f"{base.path}: base checkpoint changed since it was recorded")
    image_size = int(data.info["features"][f"observation.images.{data.cameras[0]}"]["shape"][0])
    # hub-vlm: the backbone is the base (pretrained, or a preset with random weights)
    start_from = (
        base.content_hash
        if base is not None
        else policy_type(policy.type).frozen_base(policy, task).hash
    )
    # Only what BC depends on: changing the RL settings must not retrain the warm start.
    bc_settings = config.model_dump(include={"trainable", "bc"})
    key = _key(policy, bc_settings, data.content_hash(), start_from, seed)
    out = checkpoints_dir / f"{name}-finetune-{key}"
    spec = get_robot(str(data.info.get("robot_type", "rp5")))
    cameras = list(data.cameras)
    if base is not None:  # the dataset must show the base what it was built to see
        arch = VLAConfig.from_dict(read_policy_meta(base.path)["config"])
        cameras = list(arch.cameras)
        if arch.robot != spec.name:
            raise DatasetError(
                f"{path}: dataset of robot {spec.name!r} cannot fine-tune the base {base.path}, "
                f"made for robot {arch.robot!r}"
            )
        seen = (image_size, len(spec.state_names), spec.action.dim)
        wanted = (arch.image_size, arch.state_dim, arch.action_dim)
        if seen != wanted or not set(cameras) <= set(data.cameras):
            raise DatasetError(
                f"{path}: dataset (cameras {data.cameras}, image/state/action sizes {seen}) "
                f"does not fit the base {base.path} (cameras {cameras}, sizes {wanted})"
            )
    with output_lock(out, "finetune", on_status):  # one trainer per directory
        cached = _finished(out, on_status)  # another run may have finished it while we waited
        if cached is not None:
            return cached
        job = BCJob(
            out=str(out),
            datasets=[str(path)],
            bc=config.bc,
            seed=seed,
            trainable=config.trainable,
            policy=policy if base is None else None,
            cameras=cameras,
            image_size=image_size,
            robot=spec.name,
            task=task,
            state_dim=len(spec.state_names),
            action_dim=spec.action.dim,
            base_checkpoint=base.path if base else None,
            lora=policy.lora,
            prefix_ticks=policy.prefix_ticks,
            lineage={"stage": "finetune", "code_version": code_version(), **(lineage or {})},
        )
        return _train(job, config.bc, ray_address, on_metrics)


def rl_finetune(
    start: CheckpointRef,
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    config: FinetuneConfig,
    seed: int,
    checkpoints_dir: Path,
    name: str = "policy",
    ray_address: str | None = None,
    on_metrics: MetricsFn | None = None,
    lineage: dict[str, Any] | None = None,
    lora: LoraSettings | None = None,
    on_status: StatusFn | None = None,
) -> CheckpointRef:
    """RL fine-tuning (``config.algo``: ppo, sac or grpo) in simulation on ``scene.variant``, from
    ``start``: a BC fine-tune, or a base checkpoint (then with fresh LoRA adapters). Output under
    ``checkpoints_dir/<name>-<algo>-<key>``; an interrupted run resumes from its latest learner
    checkpoint, a finished one returns its record at once. ``lora``: the adapters to add to a
    base start (the policy config's). ``on_status``: a line when this waits for, takes over or
    reuses another run's training."""
    from stages.finetune.rl import RLJob, train_rl

    if not config.is_rl:
        raise ValueError(
            f"RL fine-tuning needs finetune.algo of an RL algorithm ({', '.join(ALGORITHMS)}), "
            f"not {config.algo!r}"
        )
    if checkpoint_hash(start.path) != start.content_hash:
        raise CheckpointError(f"{start.path}: checkpoint changed since it was recorded")
    lora = lora or LoraSettings()
    key = _key(start.content_hash, config.algo, config.trainable, config.rl, robot, scene, sim)
    key = _key(key, seed, lora)
    out = checkpoints_dir / f"{name}-{config.algo}-{key}"
    with output_lock(out, "finetune", on_status):  # one trainer per directory
        cached = _finished(out, on_status)  # another run may have finished it while we waited
        if cached is not None:  # the record on disk lacks the start's lineage, as below
            return replace(cached, dataset_hashes=start.dataset_hashes)
        out.mkdir(parents=True, exist_ok=True)
        start_path = Path(start.path)
        if start.trainable == "all" and config.trainable == "lora":
            start_path = _fresh_adapters(start, lora, out / "start")
        lineage = {
            "stage": f"finetune-{config.algo}",
            "start_checkpoint": start.path,
            "start_hash": start.content_hash,
            "code_version": code_version(),
            **(lineage or {}),
        }
        job = RLJob(
            out=str(out),
            start_checkpoint=str(start_path),
            algo=config.algo,
            robot=robot,
            scene=scene,
            sim=sim,
            rl=config.rl,
            seed=seed,
            lineage=lineage,
        )
        with forwarding_metrics(out, on_metrics):
            train_rl(job, ray_address, on_status=on_status)
        ref = _record(out, lineage)
        return replace(ref, dataset_hashes=start.dataset_hashes)


def _fresh_adapters(base: CheckpointRef, lora: LoraSettings, out: Path) -> Path:
    """A LoRA checkpoint on ``base`` whose adapters are still zero: it acts exactly as the base
    does (RL instead of BC)."""
    if (out / "policy.json").is_file():
        return out
    policy = load_policy(base.path)
    policy.add_lora(lora)
    save_policy(policy, out, BaseRef(CHECKPOINT_BASE, base.path, base.content_hash))
    return out


def _finished(out: Path, on_status: StatusFn | None = None) -> CheckpointRef | None:
    """The record of a finished run at ``out`` if its checkpoint is intact (``on_status`` is
    told it is reused), else None. Call it holding ``out``'s lock."""
    ref_path = out / REF_FILE
    if not ref_path.is_file():
        return None
    ref = CheckpointRef.from_json(unmark_home(json.loads(ref_path.read_text())))
    if Path(ref.path).is_dir() and checkpoint_hash(ref.path) == ref.content_hash:
        if on_status:
            on_status(f"reusing the finished checkpoint {ref.path}")
        return ref
    ref_path.unlink()  # damaged: train again (resuming from what is intact)
    return None


def _train(
    job: BCJob, bc: BCConfig, ray_address: str | None, on_metrics: MetricsFn | None
) -> CheckpointRef:
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    with forwarding_metrics(out, on_metrics):
        if bc.workers == 0:
            train_bc(job)
        else:
            fit_on_ray_train(job, bc.workers, ray_address)
    return _record(out, job.lineage)


def _record(out: Path, lineage: dict[str, Any]) -> CheckpointRef:
    """The :class:`CheckpointRef` of a finished training run's latest checkpoint, also written
    to ``out/checkpoint_ref.json`` (which marks the run finished)."""
    latest = latest_checkpoint(out)
    if latest is None:
        raise RuntimeError(f"{out}: training finished without a checkpoint")
    meta = read_policy_meta(latest)
    policy = load_policy(latest)
    trainable, total = policy.parameter_counts()
    metrics = read_metrics(out)
    ranks = sorted((out / WORKERS_DIR).glob("rank-*"), key=lambda p: int(p.name[5:]))
    ref = CheckpointRef(
        path=str(latest),
        content_hash=checkpoint_hash(latest),
        policy_type=meta["type"],
        trainable=meta["trainable"],
        step=int(meta["lineage"]["step"]),
        trainable_params=trainable,
        total_params=total,
        base=BaseRef.from_json(meta["base"]) if meta["base"] else None,
        dataset_hashes=list(meta["lineage"].get("dataset_hashes", [])),
        config_hash=str(lineage.get("config_hash", "")),
        code_version=str(lineage.get("code_version", "")),
        metrics={k: float(v) for k, v in (metrics[-1] if metrics else {}).items() if k != "time"},
        start_checkpoint=str(lineage.get("start_checkpoint", "")),
        worker_nodes=[p.read_text() for p in ranks],
    )
    # Paths inside the robo-pipe home as $ROBO_PIPE_HOME/...: the home can move (robo_pipe.home).
    (out / REF_FILE).write_text(json.dumps(mark_home(ref.to_json()), indent=1))
    return ref
