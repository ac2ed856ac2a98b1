"""Typed configuration of training (the ``pretrain:`` and ``finetune:`` sections)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim_scenes.tasks import available_tasks
from stages.finetune.algorithm import ALGORITHMS


class BCConfig(BaseModel):
    """Behaviour cloning on Ray Train: optimisation, augmentation, parallelism, checkpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    steps: int = Field(default=2000, ge=1, le=10_000_000)
    """Optimizer steps (each over ``batch_size`` samples, summed over workers)."""
    batch_size: int = Field(default=64, ge=1, le=65_536)
    """Samples per optimizer step, split evenly across workers."""
    lr: float = Field(default=1e-3, gt=0, le=1.0)
    """Peak learning rate (AdamW)."""
    weight_decay: float = Field(default=1e-4, ge=0, le=1.0)
    warmup_steps: int = Field(default=50, ge=0)
    """Linear warm-up, then cosine decay to zero."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip."""
    aux_weight: float = Field(default=1.0, ge=0)
    """Weight of the auxiliary loss (the named object's (x, y) from the vision tokens)."""
    image_shift: int = Field(default=2, ge=0, le=16)
    """Random image translation augmentation, ± pixels."""
    after_end: Literal["masked", "hold"] = "masked"
    """A chunk's positions past its episode's end. ``masked``: not trained (LeRobot's
    padding). ``hold``: trained as holding still (the robot's ``delta`` components 0, the rest
    the episode's last action): what the robot should do once the task is done, and what an
    asynchronous loop at a long delay executes of an episode's first chunk (its first ``d``
    actions are past when it arrives). ``benchmarks/delay.py`` measures it."""
    workers: int = Field(default=1, ge=0, le=1024)
    """Ray Train workers (DDP when > 1); 0 trains in the calling process without Ray."""
    checkpoint_every: int = Field(default=250, ge=1)
    """Steps between checkpoints (training resumes from the latest)."""
    log_every: int = Field(default=25, ge=1)
    """Steps between logged metrics (loss, samples/s)."""


class PretrainConfig(BaseModel):
    """The base model: the full default VLA trained once on a broad task family, then cached."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variants: list[str] | None = None
    """Scene variants to pretrain on; default: every training variant except the target
    (``scene.variant``)."""
    episodes_per_variant: int = Field(default=1000, ge=1, le=1_000_000)
    """Demonstrations collected per pretraining variant."""
    bc: BCConfig = BCConfig(steps=3000)

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, names: list[str] | None) -> list[str] | None:
        train = available_tasks("train")
        for name in names or []:
            if name not in train:
                raise ValueError(
                    f"{name!r} is not a training scene variant; valid choices: {', '.join(train)}"
                )
        return names


class AlgorithmSettings(BaseModel):
    """An RL algorithm's config section (``finetune.rl.<name>``, the :class:`RLConfig` field
    named like the algorithm). Each section declares its own fields, ``kl_coef`` among them
    (the weight of KL(policy || frozen starting policy))."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    replans_every_step: ClassVar[bool] = False
    """The algorithm needs ``finetune.rl.horizon`` 1: it acts on one action per decision."""


class PPOConfig(AlgorithmSettings):
    """Proximal policy optimisation (clipped objective, GAE, value head, KL to the BC policy)."""

    steps_per_env: int = Field(default=32, ge=1, le=100_000)
    """Control decisions each environment contributes to one update (the rollout length)."""
    epochs: int = Field(default=2, ge=1, le=100)
    """Passes over each rollout batch."""
    minibatch_size: int = Field(default=256, ge=1, le=1_000_000)
    lr: float = Field(default=1e-4, gt=0, le=1.0)
    """Learning rate of the policy's adapters and heads (Adam)."""
    value_lr: float = Field(default=1e-3, gt=0, le=1.0)
    """Learning rate of the value head."""
    clip: float = Field(default=0.2, gt=0, le=1.0)
    """Clip range of the probability ratio."""
    gae_lambda: float = Field(default=0.95, ge=0, le=1.0)
    value_coef: float = Field(default=0.5, ge=0)
    entropy_coef: float = Field(default=0.0, ge=0)
    """Entropy bonus weight."""
    kl_coef: float = Field(default=0.02, ge=0)
    """Weight of KL(policy || frozen starting policy): keeps the VLA near what BC taught it."""


class SACConfig(AlgorithmSettings):
    """Soft actor-critic (twin Q critics on policy features and the action chunk, target
    networks, automatic temperature, KL to the BC policy)."""

    steps_per_env: int = Field(default=4, ge=1, le=100_000)
    """Control decisions each environment takes between updates."""
    updates_per_round: int = Field(default=4, ge=1, le=10_000)
    """Gradient updates per rollout round (the update-to-data ratio's numerator)."""
    batch_size: int = Field(default=128, ge=1, le=65_536)
    buffer_size: int = Field(default=30_000, ge=1, le=10_000_000)
    """Replay buffer capacity, transitions (kept in the learner)."""
    learning_starts: int = Field(default=1000, ge=0)
    """Transitions collected before the first update."""
    critic_warmup: int = Field(default=200, ge=0)
    """Updates that train only the critics: a random critic must not steer the BC policy."""
    lr: float = Field(default=1e-4, gt=0, le=1.0)
    """Learning rate of the policy's adapters and heads (Adam)."""
    critic_lr: float = Field(default=1e-3, gt=0, le=1.0)
    tau: float = Field(default=0.01, gt=0, le=1.0)
    """Polyak factor of the target critics."""
    init_alpha: float = Field(default=0.01, gt=0)
    """Initial entropy temperature (then tuned automatically)."""
    target_entropy: float | None = None
    """Entropy the temperature steers to, nats per executed chunk; default ``-action_dim *
    horizon``."""
    kl_coef: float = Field(default=0.05, ge=0)
    """Weight of KL(policy || frozen starting policy)."""


class GRPOConfig(AlgorithmSettings):
    """Group relative policy optimisation (RLinf's and SimpleVLA-RL's algorithm for VLAs):
    groups of episodes from one reset seed, each episode's advantage its outcome against its
    group's, a clipped ratio, no critic."""

    replans_every_step: ClassVar[bool] = True
    """It scores whole episodes and re-plans every control step."""

    group_size: int = Field(default=8, ge=2, le=1024)
    """Episodes played from the same reset seed (same scene, same instruction)."""
    groups_per_worker: int = Field(default=4, ge=1, le=100_000)
    """Groups each rollout worker plays per round (on ``envs_per_worker`` environments)."""
    epochs: int = Field(default=1, ge=1, le=100)
    """Passes over each round's decisions."""
    minibatch_size: int = Field(default=256, ge=1, le=1_000_000)
    """Decisions per gradient step."""
    lr: float = Field(default=1e-4, gt=0, le=1.0)
    """Learning rate of the policy's adapters and heads (Adam)."""
    clip: float = Field(default=0.2, gt=0, le=1.0)
    """Lower clip range of the probability ratio (1 - clip)."""
    clip_high: float = Field(default=0.28, gt=0, le=1.0)
    """Upper clip range (1 + clip_high): higher than ``clip`` lets rare good actions grow
    (DAPO's clip-higher, as SimpleVLA-RL uses)."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of KL(policy || frozen starting policy); SimpleVLA-RL and DAPO use none."""


class RLConfig(BaseModel):
    """RL fine-tuning on Ray: rollout-worker actors and one learner actor (``finetune.rl``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    iterations: int = Field(default=100, ge=1, le=10_000_000)
    """Learner rounds: each collects a rollout round, updates, and syncs the workers."""
    time_budget_s: float | None = Field(default=None, gt=0)
    """Stop after this many seconds of training even if iterations remain (a checkpoint is
    written on stopping)."""
    workers: int = Field(default=2, ge=1, le=1024)
    """Rollout-worker actors."""
    envs_per_worker: int = Field(default=16, ge=1, le=4096)
    """Environments each worker steps together."""
    worker_cpus: float = Field(default=0.5, gt=0)
    """Ray CPUs reserved per rollout worker (its torch and physics threads: this rounded down,
    at least 1). The default fits 2 workers and the learner on 2 cores: PPO's rollouts and
    updates alternate, so they do not compete."""
    learner_cpus: float = Field(default=1.0, gt=0)
    """Ray CPUs reserved for the learner."""
    learner_threads: int | None = Field(default=None, ge=1, le=1024)
    """Torch threads of the learner. Default: every core of its node for PPO and GRPO, whose
    rollouts and updates alternate (the rollout workers' cores are idle while it learns), and
    ``learner_cpus`` rounded down for SAC, whose rollouts run during its updates."""
    gamma: float = Field(default=0.98, gt=0, le=1.0)
    """Discount per control step."""
    horizon: int = Field(default=1, ge=1, le=64)
    """Actions of each predicted chunk executed before the policy acts again. 1 matches how
    evaluation and the edge runtime run the policy (first action, then re-plan)."""
    sync_dtype: Literal["float16", "float32"] = "float16"
    """Precision of the weights sent to workers. The learner keeps float32 master weights;
    float16 halves the bytes per sync (rollouts in reduced precision, as RLinf does)."""
    max_worker_restarts: int = Field(default=3, ge=0, le=1000)
    """Times Ray restarts each actor whose process dies (killed, out of memory): a rollout
    worker plays its rollout again; the learner goes back to its last checkpoint and the
    iterations since are done again. One more death stops the run with ``WorkersDiedError``
    (the same command resumes from the last checkpoint)."""
    checkpoint_every: int = Field(default=10, ge=1)
    """Iterations between learner checkpoints (a re-run resumes from the latest)."""
    ppo: PPOConfig = PPOConfig()
    sac: SACConfig = SACConfig()
    grpo: GRPOConfig = GRPOConfig()

    def settings(self, algo: str) -> AlgorithmSettings:
        """The section of RL algorithm ``algo`` (the field named like it)."""
        if algo not in ALGORITHMS:
            raise ValueError(
                f"unknown RL algorithm {algo!r}; valid choices: {', '.join(ALGORITHMS)}"
            )
        section: AlgorithmSettings = getattr(self, algo)
        return section

    def learner_torch_threads(self, on_policy: bool, cores: int) -> int:
        """Torch threads of the learner of an algorithm that is ``on_policy`` (or not) on a node
        with ``cores`` cores (``learner_threads``)."""
        if self.learner_threads is not None:
            return self.learner_threads
        return cores if on_policy else max(1, int(self.learner_cpus))


class FinetuneConfig(BaseModel):
    """Fine-tuning the base on the target task: behaviour cloning, then optionally RL."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    algo: str = "bc"
    """``bc``: behaviour cloning only. An RL algorithm of
    :data:`stages.finetune.algorithm.ALGORITHMS` (``ppo`` / ``sac`` / ``grpo``): RL in
    simulation after the BC warm start (or instead of it, with ``warm_start: none``)."""
    warm_start: Literal["bc", "none"] = "bc"
    """RL only: start from the BC fine-tune (``bc``) or from the base with fresh adapters."""
    trainable: Literal["lora", "all"] = "lora"
    """``lora``: freeze the base, train LoRA adapters + heads; ``all``: full fine-tuning."""
    bc: BCConfig = BCConfig()
    rl: RLConfig = RLConfig()

    @property
    def is_rl(self) -> bool:
        """RL in simulation runs (after or instead of BC)."""
        return self.algo in ALGORITHMS

    @field_validator("algo")
    @classmethod
    def _known_algo(cls, name: str) -> str:
        if name != "bc" and name not in ALGORITHMS:
            raise ValueError(
                f"unknown algorithm {name!r}; valid choices: bc, {', '.join(ALGORITHMS)}"
            )
        return name

    @model_validator(mode="after")
    def _one_action_per_decision(self) -> FinetuneConfig:
        if self.is_rl and self.rl.settings(self.algo).replans_every_step and self.rl.horizon != 1:
            raise ValueError(
                f"finetune.algo {self.algo} re-plans every control step: "
                f"finetune.rl.horizon must be 1, got {self.rl.horizon}"
            )
        return self
