"""The RL learner: the policy being trained, the frozen start policy, and the algorithm's state
(the class :mod:`stages.finetune.algorithm` names: PPO, SAC, GRPO).

It runs as one Ray actor (see :mod:`stages.finetune.rl`); Ray restarts it if its process dies,
and its constructor then continues from the latest checkpoint, as a re-run does. After each
update it hands out only the parameters RL trains (LoRA adapters, action head, log-std) and
the algorithm's acting modules (PPO's value head) as numpy arrays in the sync precision; the
workers load them in place.

A learner checkpoint is a policy checkpoint (``step-XXXXXXX/`` with ``policy.json``, the
adapters and heads in ``model.safetensors``, the tokenizer: exportable and evaluable as is)
plus ``training/``: the algorithm's heads (value head or critics), optimizer moments and
counters, so a re-run resumes where the last checkpoint left off. SAC's replay buffer is not
saved; a resumed SAC run refills it before updating again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stages.finetune.algorithm import algorithm_class
from stages.finetune.checkpoints import (
    commit_checkpoint,
    latest_checkpoint,
    restore_training_state,
)
from stages.finetune.config import RLConfig
from stages.finetune.rollout import rl_parameters
from stages.finetune.rounds import GroupRollout, Rollout, concat_groups, concat_rollouts
from stages.policy.checkpoint import load_policy, load_trainable, read_policy_meta
from stages.policy.types import BaseRef

LEARNER_FILE = "learner.safetensors"
"""In a step checkpoint's ``training/``: the algorithm's modules and optimizer moments."""


class Learner:
    """Holds the optimizer state; ``update`` trains on a round of rollouts."""

    def __init__(
        self,
        start_checkpoint: str,
        algo: str,
        rl: RLConfig,
        seed: int,
        out: str,
    ) -> None:
        self.cfg = rl
        algorithm = algorithm_class(algo)
        torch.set_num_threads(
            self.cfg.learner_torch_threads(algorithm.on_policy, os.cpu_count() or 1)
        )
        torch.manual_seed(seed)
        self.out = Path(out)
        self.policy = load_policy(start_checkpoint)
        self.reference = load_policy(start_checkpoint).eval().requires_grad_(False)
        meta = read_policy_meta(start_checkpoint)
        self.base = BaseRef.from_json(meta["base"]) if meta.get("base") else None
        self.params = rl_parameters(self.policy)
        self.algo = algorithm(
            self.policy,
            self.reference,
            self.params,
            self.cfg.settings(algo),
            self.cfg.gamma,
            self.cfg.horizon,
            seed,
        )
        self.iteration = 0
        latest = latest_checkpoint(self.out)
        if latest is not None:
            self.restore(latest)

    def state(self) -> dict[str, Any]:
        """Where training stands: iteration, the sizes weight sync is judged by, and the
        process (a restarted learner has a new one, and is at its last checkpoint)."""
        dtype = np.dtype(self.cfg.sync_dtype)
        synced = sum(p.numel() for p in self._synced().values())
        full = sum(p.numel() for n, p in self.policy.named_parameters() if "lora_" not in n)
        return {
            "iteration": self.iteration,
            "pid": os.getpid(),
            "sync_bytes": synced * dtype.itemsize,
            "full_model_bytes": full * 4,
            "synced_params": synced,
            "full_params": full,
            "threads": torch.get_num_threads(),
        }

    def _synced(self) -> dict[str, torch.Tensor]:
        """What the workers act with: the trainable parameters, then the acting modules'
        parameters as ``<module>/<name>``."""
        synced: dict[str, torch.Tensor] = dict(self.params)
        for module_name, module in self.algo.acting_modules().items():
            for name, param in module.named_parameters():
                synced[f"{module_name}/{name}"] = param
        return synced

    def weights(self) -> dict[str, np.ndarray]:
        """What the workers act with, in the sync precision (what workers load)."""
        dtype = np.dtype(self.cfg.sync_dtype)
        return {n: p.detach().numpy().astype(dtype) for n, p in self._synced().items()}

    def update(self, rollouts: list[Rollout] | list[GroupRollout]) -> dict[str, float]:
        """One algorithm update on the round's rollouts; returns its metrics."""
        tick = time.perf_counter()
        if isinstance(rollouts[0], GroupRollout):
            batch: Rollout | GroupRollout = concat_groups(rollouts)
        else:
            batch = concat_rollouts(rollouts)
        metrics = self.algo.update(batch)
        self.iteration += 1
        return metrics | {"learn_compute_s": time.perf_counter() - tick}

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self, lineage: dict[str, Any]) -> str:
        """Write ``step-<iteration>`` atomically; keep the newest two. Returns its path."""
        tensors: dict[str, torch.Tensor] = {}
        groups: dict[str, Any] = {}
        for name, module in self.algo.modules().items():
            for key, value in module.state_dict().items():
                tensors[f"module/{name}/{key}"] = value.contiguous()
        for name, optimizer in self.algo.optimizers().items():
            state = optimizer.state_dict()
            groups[name] = state["param_groups"]
            for index, slots in state["state"].items():
                for slot, value in slots.items():
                    tensors[f"optim/{name}/{index}/{slot}"] = value.contiguous()
        extra = {
            "param_groups": groups,
            "algo": self.algo.extra_state(),
            "rng": self.algo.rng.bit_generator.state,
        }
        lineage = {**lineage, "step": self.iteration}
        return str(
            commit_checkpoint(
                self.out,
                self.iteration,
                self.policy,
                self.base,
                lineage,
                tensors,
                LEARNER_FILE,
                extra,
            )
        )

    def restore(self, directory: Path) -> None:
        """Continue from a checkpoint written by :meth:`checkpoint`."""
        load_trainable(self.policy, directory / "model.safetensors")
        tensors, state = restore_training_state(directory, LEARNER_FILE)
        for name, module in self.algo.modules().items():
            prefix = f"module/{name}/"
            module.load_state_dict(
                {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            )
        for name, optimizer in self.algo.optimizers().items():
            prefix = f"optim/{name}/"
            slots: dict[int, dict[str, torch.Tensor]] = {}
            for key, value in tensors.items():
                if key.startswith(prefix):
                    index, slot = key[len(prefix) :].split("/")
                    slots.setdefault(int(index), {})[slot] = value
            optimizer.load_state_dict({"state": slots, "param_groups": state["param_groups"][name]})
        self.algo.load_extra_state(state["algo"])
        self.algo.rng.bit_generator.state = state["rng"]
        self.iteration = int(state["step"])
