"""The policy interface every model type implements, and its ONNX export wrapper.

A policy maps a batch of observations -- camera images (uint8 ``(B, H, W, 3)`` per camera),
proprioceptive state (float ``(B, state_dim)``, robot units) and instructions (``B`` strings)
-- to a Gaussian over an action chunk (``(B, chunk_len, action_dim)``, robot units). The
observation batch is :class:`sim_scenes.batched_env.BatchedObservation`, the same record the
simulators and the robot driver produce.

Model types differ only in :meth:`VLAPolicy.encode` (vision + language + state -> one feature
vector per action query); the heads, normalisation, LoRA, distribution and export live here once:

    encode(...)            -> features (B, chunk_len, d), vision tokens (B, n_vision, d)
    action_head(features)  -> mean (B, chunk_len, action_dim), normalised units
    log_std                -> (action_dim,), normalised units, state-independent
    target_head(vision)    -> (B, 2): the named object's (x, y), normalised -- an auxiliary
                              training signal that teaches the vision encoder where the named
                              object is (BC alone left it at ~5% success; see issue 4's note);
                              not part of the exported graph.
    prefix_encoder(prefix) -> (B, d), added to every action query's features: a
                              delay-conditioned policy (``prefix_ticks`` > 0) also takes the
                              committed prefix, the first actions of its chunk the robot
                              executes while the chunk is computed (:meth:`VLAPolicy.with_prefix`)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from peft import LoraConfig, inject_adapter_in_model
from torch import nn
from torch.distributions import Normal

from sim_scenes.batched_env import BatchedObservation
from stages.dataset.layout import ACTION_KEY, ENV_STATE_KEY, STATE_KEY
from stages.policy.config import LoraSettings, VLAConfig

Tensor = torch.Tensor
Images = dict[str, torch.Tensor]
"""Camera name -> uint8 images ``(B, H, W, 3)``."""
Encoded = tuple[torch.Tensor, torch.Tensor]
"""What :meth:`VLAPolicy.encode` returns: (action-query features ``(B, chunk_len, d)``, vision
tokens ``(B, n_vision, d)``)."""


def masked_mean(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``tokens`` ``(B, L, d)`` over the positions ``mask`` ``(B, L)`` marks (1 = a
    token, 0 = padding): ``(B, d)``; an all-padding row gives zeros."""
    mask = mask.to(torch.float32)
    return (tokens * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)


class PolicyTokenizer(Protocol):
    """Instruction text -> fixed-length token ids, saved beside the model."""

    max_tokens: int

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask (1 = real token), int64 ``(len(texts), max_tokens)``."""
        ...

    def save(self, directory: str) -> None:
        """Write the tokenizer files into ``directory``."""
        ...


@dataclass
class Normalizer:
    """Per-dimension mean/std (robot units) of state, action and the auxiliary target (x, y)."""

    state_mean: list[float] = field(default_factory=list)
    state_std: list[float] = field(default_factory=list)
    action_mean: list[float] = field(default_factory=list)
    action_std: list[float] = field(default_factory=list)
    target_mean: list[float] = field(default_factory=lambda: [0.0, 0.0])
    target_std: list[float] = field(default_factory=lambda: [1.0, 1.0])

    @classmethod
    def identity(cls, state_dim: int, action_dim: int) -> Normalizer:
        """No normalisation (a freshly built model before it sees data)."""
        return cls([0.0] * state_dim, [1.0] * state_dim, [0.0] * action_dim, [1.0] * action_dim)

    @classmethod
    def from_stats(cls, stats: dict[str, Any], min_std: float = 1e-3) -> Normalizer:
        """From a LeRobot ``stats.json`` dict (``observation.state``, ``action`` and, when
        present, ``observation.environment_state`` whose first two values are the target x, y).

        ``min_std`` (robot units) floors each std: a dimension the demonstrations hold constant
        (the expert's gripper opening) would otherwise turn float rounding noise into
        unit-variance targets -- measured: a sixth of the BC loss was that noise.
        """

        def floored(values: list[float]) -> list[float]:
            return [max(float(v), min_std) for v in values]

        norm = cls(
            state_mean=[float(v) for v in stats[STATE_KEY]["mean"]],
            state_std=floored(stats[STATE_KEY]["std"]),
            action_mean=[float(v) for v in stats[ACTION_KEY]["mean"]],
            action_std=floored(stats[ACTION_KEY]["std"]),
        )
        if ENV_STATE_KEY in stats:
            norm.target_mean = [float(v) for v in stats[ENV_STATE_KEY]["mean"][:2]]
            norm.target_std = floored(stats[ENV_STATE_KEY]["std"][:2])
        return norm

    def to_dict(self) -> dict[str, list[float]]:
        """JSON-serialisable form."""
        return asdict(self)


@dataclass
class PolicyOutput:
    """What :meth:`VLAPolicy.forward` returns (normalised units)."""

    mean: torch.Tensor
    """Action chunk mean ``(B, chunk_len, action_dim)``."""
    log_std: torch.Tensor
    """Log standard deviation ``(action_dim,)``."""
    features: torch.Tensor
    """Action-query features ``(B, chunk_len, d)`` (RL value and Q heads read these)."""
    target_xy: torch.Tensor
    """Auxiliary prediction of the named object's (x, y) ``(B, 2)``."""


class VLAPolicy(nn.Module, ABC):
    """Base of every policy type (see module docstring). Subclasses implement :meth:`encode`.

    Class attributes:
        head_names: top-level modules/parameters that always train (also under LoRA).
        lora_target_modules: regex of the module names LoRA adapts.
    """

    head_names: ClassVar[tuple[str, ...]] = (
        "action_head",
        "log_std",
        "target_head",
        "prefix_encoder",
    )
    lora_target_modules: ClassVar[str]
    separate_instruction_graph: ClassVar[bool] = False
    """True: the instruction is encoded by its own step (``encode_instruction``: token
    ids/mask -> features), run once per episode and exported as its own graph; the policy
    graph takes the features. False: the policy graph takes the token ids."""

    state_mean: torch.Tensor  # normalisation buffers (not persistent: saved in policy.json)
    state_std: torch.Tensor
    action_mean: torch.Tensor
    action_std: torch.Tensor
    target_mean: torch.Tensor
    target_std: torch.Tensor

    def __init__(
        self,
        cfg: VLAConfig,
        tokenizer: PolicyTokenizer,
        normalizer: Normalizer | None,
        width: int,
        vision_tokens: int,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.lora: LoraSettings | None = None
        self.action_head = nn.Linear(width, cfg.action_dim)
        self.log_std = nn.Parameter(torch.full((cfg.action_dim,), cfg.init_log_std))
        self.target_head = nn.Linear(vision_tokens * width, 2)
        self.width = width
        self.prefix_encoder: nn.Sequential | None = None
        if cfg.prefix_ticks:
            self.condition_on_prefix(cfg.prefix_ticks)
        self.set_normalizer(normalizer or Normalizer.identity(cfg.state_dim, cfg.action_dim))

    def condition_on_prefix(self, ticks: int) -> None:
        """Make this policy delay-conditioned up to ``ticks`` committed actions (a fine-tune of
        a base that was not): adds :attr:`prefix_encoder`, whose last layer starts at zero so
        the policy starts out acting exactly as before."""
        if ticks >= self.cfg.chunk_len:
            raise ValueError(f"prefix_ticks {ticks} must be below chunk_len {self.cfg.chunk_len}")
        self.cfg = replace(self.cfg, prefix_ticks=ticks)
        if self.prefix_encoder is not None:
            return
        given = self.cfg.chunk_len * (self.cfg.action_dim + 1)  # each action and its mask bit
        last = nn.Linear(self.width, self.width)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.prefix_encoder = nn.Sequential(nn.Linear(given, self.width), nn.GELU(), last)

    def with_prefix(
        self, features: Tensor, prefix: Tensor | None, prefix_mask: Tensor | None
    ) -> Tensor:
        """Action-query ``features`` ``(B, chunk_len, d)`` told the committed prefix: ``prefix``
        ``(B, chunk_len, action_dim)`` robot units (the chunk's own first actions, as the policy
        outputs them), ``prefix_mask`` ``(B, chunk_len)`` 1 where an action is committed (the
        first ``d``), 0 elsewhere. One encoding of the whole prefix is added to every query:
        the action head works per position, and every action after the prefix must see all of
        it. None (or a policy that is not delay-conditioned): nothing committed."""
        if self.prefix_encoder is None:
            return features
        if prefix is None or prefix_mask is None:
            batch, length, _ = features.shape
            prefix = features.new_zeros(batch, length, self.cfg.action_dim)
            prefix_mask = features.new_zeros(batch, length)
        mask = prefix_mask.to(features.dtype)[..., None]
        given = torch.cat([self.normalize_actions(prefix) * mask, mask], dim=-1).flatten(1)
        return features + self.prefix_encoder(given)[:, None, :]

    # -- what a model type provides ------------------------------------------------------------

    @abstractmethod
    def encode(self, images: Images, state: Tensor, tokens: Tensor, token_mask: Tensor) -> Encoded:
        """Observations -> (action-query features ``(B, chunk_len, d)``, vision tokens
        ``(B, n_vision, d)``). ``state`` is already normalised; images are uint8 BHWC."""

    # -- normalisation -------------------------------------------------------------------------

    def set_normalizer(self, norm: Normalizer) -> None:
        """Install normalisation statistics (from the training dataset's stats)."""
        self.normalizer = norm
        for name, values in asdict(norm).items():
            tensor = torch.tensor(values, dtype=torch.float32)
            if name.endswith("_std"):
                tensor = tensor.clamp_min(1e-6)
            self.register_buffer(name, tensor, persistent=False)

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Robot-unit actions -> normalised units, same shape."""
        return (actions - self.action_mean) / self.action_std

    def denormalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalised actions -> robot units, same shape."""
        return actions * self.action_std + self.action_mean

    def normalize_target(self, xy: torch.Tensor) -> torch.Tensor:
        """Target (x, y) in m -> normalised units."""
        return (xy - self.target_mean) / self.target_std

    # -- inference -----------------------------------------------------------------------------

    def forward(
        self,
        images: dict[str, torch.Tensor],
        state: torch.Tensor,
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        prefix: torch.Tensor | None = None,
        prefix_mask: torch.Tensor | None = None,
    ) -> PolicyOutput:
        """Images uint8 ``(B, H, W, 3)`` per camera, state ``(B, state_dim)`` robot units,
        tokens/mask int64 ``(B, max_tokens)``, and for a delay-conditioned policy the committed
        prefix (:meth:`with_prefix`; None: nothing committed) -> :class:`PolicyOutput`."""
        features, vision = self.encode(
            images, (state - self.state_mean) / self.state_std, tokens, token_mask
        )
        features = self.with_prefix(features, prefix, prefix_mask)
        return PolicyOutput(
            mean=self.action_head(features),
            log_std=self.log_std,
            features=features,
            target_xy=self.target_head(vision.flatten(1)),
        )

    def model_inputs(self, obs: BatchedObservation) -> dict[str, Any]:
        """A batched observation -> the keyword arguments of :meth:`forward`."""
        tokens, mask = self.tokenizer(list(obs.instruction))
        return {
            "images": {c: torch.as_tensor(obs.images[c]) for c in self.cfg.cameras},
            "state": torch.as_tensor(obs.state, dtype=torch.float32),
            "tokens": torch.as_tensor(tokens),
            "token_mask": torch.as_tensor(mask),
        }

    def distribution(self, obs: BatchedObservation) -> Normal:
        """Gaussian over the action chunk in robot units, batch shape ``(B, chunk_len,
        action_dim)`` (sum ``log_prob`` over the last two axes for a chunk's log-probability)."""
        out = self(**self.model_inputs(obs))
        std = out.log_std.exp() * self.action_std
        return Normal(self.denormalize_actions(out.mean), std.expand_as(out.mean))

    @torch.no_grad()
    def predict_chunk(
        self,
        obs: BatchedObservation,
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Mean action chunk in robot units, float32 ``(B, chunk_len, action_dim)``; ``prefix``
        and ``prefix_mask``: the committed prefix (:meth:`with_prefix`), None: none."""
        committed = {}
        if prefix is not None and prefix_mask is not None:
            committed = {
                "prefix": torch.as_tensor(prefix, dtype=torch.float32),
                "prefix_mask": torch.as_tensor(prefix_mask, dtype=torch.float32),
            }
        out = self(**self.model_inputs(obs), **committed)
        return self.denormalize_actions(out.mean).numpy().astype(np.float32)

    # -- what trains ---------------------------------------------------------------------------

    def add_lora(self, settings: LoraSettings) -> None:
        """Inject ``peft`` LoRA adapters and freeze everything except adapters and heads."""
        if self.lora is not None:
            raise RuntimeError("LoRA adapters are already injected")
        config = LoraConfig(
            r=settings.rank,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=self.lora_targets(settings),
        )
        inject_adapter_in_model(config, self)
        self.lora = settings
        for name, param in self.named_parameters():
            param.requires_grad = "lora_" in name or self._is_head(name)

    def lora_targets(self, settings: LoraSettings) -> str:
        """Regex over module names that LoRA adapts (``settings`` may widen it)."""
        return self.lora_target_modules

    def _is_head(self, name: str) -> bool:
        return name.split(".")[0] in self.head_names

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Name -> tensor of every parameter that trains: what a checkpoint stores."""
        return {n: p.detach() for n, p in self.named_parameters() if p.requires_grad}

    def parameter_counts(self) -> tuple[int, int]:
        """(trainable, total) parameter counts; under LoRA the total excludes the adapters."""
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        total = sum(p.numel() for n, p in self.named_parameters() if "lora_" not in n)
        return trainable, total
