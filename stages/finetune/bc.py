"""Behaviour cloning: the loop every Ray Train worker runs (or the calling process, workers=0).

    data   = load_bc_data(datasets)            every frame in memory, chunk targets, target xy
    policy = new model | base + LoRA | base     with the data's normalisation stats
    resume from the latest checkpoint in out/   weights, AdamW state, torch RNG, step
    for step in start..steps:
        batch  = frames drawn with rng(seed, rank, step), images shifted ± image_shift px
                 (a delay-conditioned policy: + a committed prefix of 0..prefix_ticks actions)
        loss   = masked MSE(action chunk) + aux_weight * MSE(target xy) + NLL(log_std | mean)
        clip gradients, cosine learning rate, AdamW step   (DDP averages gradients when N > 1)
        every log_every: metrics.jsonl;  every checkpoint_every and at the end: checkpoint

Batches are a pure function of (seed, rank, step), so a resumed run draws exactly the batches
the interrupted one would have: with the restored optimizer state it continues bit for bit.
The Gaussian's log-std is fitted by its likelihood with the mean detached, so the action MSE
alone shapes the mean while RL later gets a calibrated spread.
"""

from __future__ import annotations

import json
import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from robots.spec import get_robot
from stages.finetune.checkpoints import (
    commit_checkpoint,
    latest_checkpoint,
    log_metrics,
    restore_training_state,
)
from stages.finetune.config import BCConfig
from stages.finetune.data import BCData, load_bc_data, simulated_delays
from stages.policy.base import Normalizer, VLAPolicy
from stages.policy.checkpoint import (
    CheckpointError,
    checkpoint_hash,
    load_policy,
    load_trainable,
    new_policy,
)
from stages.policy.config import LoraSettings, PolicyConfig
from stages.policy.types import CHECKPOINT_BASE, BaseRef


@dataclass
class BCJob:
    """Everything a training worker needs (sent as it is to Ray Train's workers)."""

    out: str
    """Run directory: ``step-XXXXXXX`` checkpoints and ``metrics.jsonl``."""
    datasets: list[str]
    bc: BCConfig
    seed: int
    trainable: str
    """``all`` or ``lora``."""
    policy: PolicyConfig | None = None
    """A new model's architecture (pretraining, or a hub-vlm backbone)."""
    cameras: list[str] = field(default_factory=list)
    image_size: int = 64
    robot: str = ""
    """A new model's robot (registry name), whose state and action sizes follow."""
    task: str = ""
    """A new model's task family (:mod:`sim_scenes.tasks`), whose instructions its own
    tokenizer learns."""
    state_dim: int = 0
    action_dim: int = 0
    base_checkpoint: str | None = None
    """Fine-tuning: the base checkpoint to start from (frozen under LoRA)."""
    lora: LoraSettings | None = None
    """The adapters to train (``trainable == "lora"``; default settings if None)."""
    lineage: dict[str, Any] = field(default_factory=dict)
    threads: int = 0
    """torch threads per worker; 0 = torch's default."""
    prefix_ticks: int = 0
    """Delay-conditioned training up to this many committed actions (``policy.prefix_ticks``;
    a base that was not is made so: :meth:`~stages.policy.base.VLAPolicy.condition_on_prefix`);
    0: off."""


def learning_rate(cfg: BCConfig, step: int) -> float:
    """Linear warm-up to ``cfg.lr``, then cosine decay to zero at ``cfg.steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_policy(job: BCJob, data: BCData) -> tuple[VLAPolicy, BaseRef | None]:
    """The model to train, with the data's normalisation and only the right parameters
    trainable."""
    norm = Normalizer.from_stats(data.stats)
    if job.base_checkpoint is None:
        if not (job.robot and job.task):
            raise ValueError("a BC job for a new model names its robot and task family")
        policy, base = new_policy(
            job.policy or PolicyConfig(),
            job.cameras,
            job.image_size,
            job.robot,
            job.state_dim,
            job.action_dim,
            norm,
            job.task,
        )
    else:
        policy = load_policy(job.base_checkpoint)
        policy.set_normalizer(norm)
        base = BaseRef(CHECKPOINT_BASE, job.base_checkpoint, checkpoint_hash(job.base_checkpoint))
    if job.prefix_ticks:  # before LoRA: its encoder is a head, trained either way
        policy.condition_on_prefix(job.prefix_ticks)
    if job.trainable == "lora":
        policy.add_lora(job.lora or LoraSettings())
    else:
        policy.requires_grad_(True)
    return policy, base


OPTIMIZER_FILE = "optimizer.safetensors"
"""In a step checkpoint's ``training/``: AdamW moments and step counts, by parameter name."""


def optimizer_tensors(
    optimizer: torch.optim.Optimizer, names: dict[int, str]
) -> dict[str, torch.Tensor]:
    """AdamW's state as tensors named ``<parameter>/<slot>`` (what a checkpoint saves)."""
    return {
        f"{names[id(param)]}/{key}": value.detach().clone().reshape(value.shape)
        for param, state in optimizer.state.items()
        for key, value in state.items()
    }


def load_training_state(
    directory: Path, optimizer: torch.optim.Optimizer, params: dict[str, nn.Parameter]
) -> int:
    """Restore the optimizer and the torch RNG of a checkpoint; returns the step to continue
    from."""
    tensors, state = restore_training_state(directory, OPTIMIZER_FILE)
    for key, value in tensors.items():
        name, _, slot = key.rpartition("/")
        if name not in params:
            raise CheckpointError(f"{directory}: optimizer state for unknown parameter {name}")
        optimizer.state[params[name]][slot] = value
    return int(state["step"])


def bc_loss(
    model: nn.Module,
    policy: VLAPolicy,
    batch: dict[str, Any],
    tokens: torch.Tensor,
    token_mask: torch.Tensor,
    aux_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, action-chunk MSE, auxiliary target MSE) on ``batch`` (from :meth:`BCData.batch`).

    ``model`` is ``policy`` or its DDP wrapper; ``tokens``/``token_mask`` are the tokenized
    instructions, indexed by ``batch["task"]``. All terms are in normalised units.
    """
    task = torch.as_tensor(batch["task"])
    committed = {k: torch.as_tensor(batch[k]) for k in ("prefix", "prefix_mask") if k in batch}
    out = model(
        {c: torch.as_tensor(v) for c, v in batch["images"].items()},
        torch.as_tensor(batch["state"]),
        tokens[task],
        token_mask[task],
        **committed,
    )
    target = policy.normalize_actions(torch.as_tensor(batch["actions"]))
    valid = torch.as_tensor(batch["action_valid"], dtype=torch.float32)[..., None]
    if "prefix_mask" in batch:  # the committed actions are given, not predicted
        valid = valid * (1.0 - torch.as_tensor(batch["prefix_mask"])[..., None])
    denom = valid.sum() * target.shape[-1]
    action_loss = ((out.mean - target) ** 2 * valid).sum() / denom
    std = out.log_std.exp()
    nll = (((out.mean.detach() - target) / std) ** 2 / 2 + out.log_std) * valid
    loss = action_loss + nll.sum() / denom
    aux_loss = torch.zeros(())
    if aux_weight > 0:
        xy = policy.normalize_target(torch.as_tensor(batch["target_xy"]))
        aux_loss = ((out.target_xy - xy) ** 2).mean()
        loss = loss + aux_weight * aux_loss
    else:
        # No target to supervise the auxiliary head with (a dataset without the objects'
        # positions): a zero-weighted term still gives it a (zero) gradient, which DDP requires
        # of every trainable parameter when two or more workers train.
        loss = loss + 0.0 * out.target_xy.sum()
    return loss, action_loss, aux_loss


def train_bc(job: BCJob, rank: int = 0, world_size: int = 1) -> None:
    """Run (or resume) behaviour cloning to ``job.bc.steps``; rank 0 writes checkpoints."""
    cfg = job.bc
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    if job.threads:
        torch.set_num_threads(job.threads)
    torch.manual_seed(job.seed)  # identical initial weights on every rank
    data = load_bc_data(job.datasets, tuple(job.cameras), _chunk_len(job), _held(job))
    policy, base = build_policy(job, data)
    tokens, token_mask = (torch.as_tensor(a) for a in policy.tokenizer(data.instructions))
    params = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(params.values(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    latest = latest_checkpoint(out)
    if latest is not None:
        load_trainable(policy, latest / "model.safetensors")
        start = load_training_state(latest, optimizer, params)
    model: nn.Module = policy
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(policy)
    per_worker = max(1, cfg.batch_size // world_size)
    aux_weight = cfg.aux_weight if data.target_xy is not None else 0.0
    names = {id(p): n for n, p in params.items()}
    tick, samples = time.perf_counter(), 0
    for step in range(start, cfg.steps):
        rng = np.random.default_rng([job.seed, rank, step])
        b = data.batch(rng.integers(len(data), size=per_worker), rng, cfg.image_shift)
        if policy.cfg.prefix_ticks:  # the committed prefix the delay it simulates gives
            b |= simulated_delays(b, rng, policy.cfg.prefix_ticks)
        loss, action_loss, aux_loss = bc_loss(model, policy, b, tokens, token_mask, aux_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(list(params.values()), cfg.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        optimizer.step()
        samples += per_worker * world_size
        done = step + 1
        if rank == 0 and (done % cfg.log_every == 0 or done == cfg.steps):
            now = time.perf_counter()
            log_metrics(
                out,
                {
                    "step": done,
                    "loss": loss.item(),
                    "action_loss": action_loss.item(),
                    "aux_loss": aux_loss.item(),
                    "grad_norm": grad_norm.item(),
                    "lr": learning_rate(cfg, step),
                    "samples_per_s": samples / (now - tick),
                    # ru_maxrss is KiB on Linux: this worker's peak resident memory
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    "time": time.time(),
                },
            )
            tick, samples = now, 0
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            if rank == 0:
                _checkpoint(out, policy, base, optimizer, names, done, job, data)
            if world_size > 1:
                torch.distributed.barrier()


def _held(job: BCJob) -> np.ndarray | None:
    """``finetune.bc.after_end: hold``: the robot's step (``delta``) components, held at 0 past
    an episode's end; None: masked."""
    if job.bc.after_end != "hold":
        return None
    spec = get_robot(job.robot)
    return np.array([kind == "delta" for kind in spec.action.kinds])


def _chunk_len(job: BCJob) -> int:
    if job.base_checkpoint is not None:
        meta = json.loads((Path(job.base_checkpoint) / "policy.json").read_text())
        return int(meta["config"]["chunk_len"])
    return (job.policy or PolicyConfig()).chunk_len


def _checkpoint(
    out: Path,
    policy: VLAPolicy,
    base: BaseRef | None,
    optimizer: torch.optim.Optimizer,
    names: dict[int, str],
    step: int,
    job: BCJob,
    data: BCData,
) -> None:
    lineage = {**job.lineage, "step": step, "dataset_hashes": data.hashes, "seed": job.seed}
    tensors = optimizer_tensors(optimizer, names)
    commit_checkpoint(out, step, policy, base, lineage, tensors, OPTIMIZER_FILE, {})
