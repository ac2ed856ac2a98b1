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
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol, cast

import numpy as np
import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
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

    head_names: ClassVar[tuple[str, ...]] = ("action_head", "log_std", "target_head")
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
        self.set_normalizer(normalizer or Normalizer.identity(cfg.state_dim, cfg.action_dim))

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
    ) -> PolicyOutput:
        """Images uint8 ``(B, H, W, 3)`` per camera, state ``(B, state_dim)`` robot units,
        tokens/mask int64 ``(B, max_tokens)`` -> :class:`PolicyOutput`."""
        features, vision = self.encode(
            images, (state - self.state_mean) / self.state_std, tokens, token_mask
        )
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
    def predict_chunk(self, obs: BatchedObservation) -> np.ndarray:
        """Mean action chunk in robot units, float32 ``(B, chunk_len, action_dim)``."""
        out = self(**self.model_inputs(obs))
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

    # -- export --------------------------------------------------------------------------------

    def as_onnx(self) -> OnnxPolicy:
        """A copy with LoRA merged into the base weights, wrapped for ``torch.onnx.export``."""
        model = copy.deepcopy(self).eval()
        for module in model.modules():
            if isinstance(module, LoraLayer):
                module.merge()
        return OnnxPolicy(model)


class InstructionEncoding(Protocol):
    """What a policy with ``separate_instruction_graph`` adds: the instruction encoded once
    (token ids/mask -> features) by its own module, the rest of the policy from the features."""

    instruction_encoder: nn.Module
    """Token ids/mask int64 ``(B, L)`` -> instruction features float ``(B, L, F)``."""

    def encode_instruction(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """Token ids/mask ``(B, L)`` -> instruction features ``(B, L, F)``."""
        ...

    def encode_encoded(
        self, images: Images, state: Tensor, instruction: Tensor, token_mask: Tensor
    ) -> Encoded:
        """:meth:`VLAPolicy.encode` from instruction features."""
        ...


class OnnxPolicy(nn.Module):
    """Export wrapper: fixed input/output names, robot units in and out, no tokenizer.

    Inputs (in order): ``image_<camera>`` uint8 ``(B, H, W, 3)`` per camera, ``state`` float32
    ``(B, state_dim)`` robot units, then the instruction: ``tokens`` and ``token_mask`` int64
    ``(B, max_tokens)`` (from the tokenizer shipped beside the model), or, for a policy with
    ``separate_instruction_graph``, ``instruction`` float32 ``(B, max_tokens, F)`` (what
    :meth:`instruction_graph`'s graph computes from the tokens, once per episode) and
    ``token_mask``. Outputs: ``actions`` float32 ``(B, chunk_len, action_dim)`` robot units
    (the Gaussian's mean) and ``action_std`` float32 ``(B, chunk_len, action_dim)``. State
    normalisation and action de-normalisation are inside.
    """

    output_names: ClassVar[list[str]] = ["actions", "action_std"]

    def __init__(self, policy: VLAPolicy) -> None:
        super().__init__()
        self.policy = policy
        self.cameras = policy.cfg.cameras
        self.separate = policy.separate_instruction_graph
        text = ["instruction", "token_mask"] if self.separate else ["tokens", "token_mask"]
        self.input_names = [f"image_{c}" for c in self.cameras] + ["state", *text]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.cameras)
        images = dict(zip(self.cameras, inputs[:n], strict=True))
        state, text, token_mask = inputs[n:]
        if self.separate:
            encoding = cast(InstructionEncoding, self.policy)
            normalized = (state - self.policy.state_mean) / self.policy.state_std
            features, _ = encoding.encode_encoded(images, normalized, text, token_mask)
            mean, log_std = self.policy.action_head(features), self.policy.log_std
        else:
            out = self.policy(images, state, text, token_mask)
            mean, log_std = out.mean, out.log_std
        std = (log_std.exp() * self.policy.action_std).expand_as(mean)
        return self.policy.denormalize_actions(mean), std

    def instruction_graph(self) -> OnnxInstructionEncoder | None:
        """The instruction's own graph (None: the policy graph takes the tokens)."""
        if not self.separate:
            return None
        return OnnxInstructionEncoder(cast(InstructionEncoding, self.policy).instruction_encoder)

    def graph_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The policy graph's inputs from batched observations as numpy arrays (images,
        ``state``, ``tokens`` and ``token_mask``): as they are, or with an instruction graph
        the tokens replaced by the features the policy's instruction encoder gives them."""
        if not self.separate:
            return {k: inputs[k] for k in self.input_names}
        encoding = cast(InstructionEncoding, self.policy)
        with torch.no_grad():
            features = encoding.encode_instruction(
                torch.as_tensor(inputs["tokens"]), torch.as_tensor(inputs["token_mask"])
            )
        given = inputs | {"instruction": features.numpy().astype(np.float32)}
        return {k: given[k] for k in self.input_names}

    def dummy_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """Example inputs of the right shapes and dtypes (tracing, parity checks)."""
        cfg = self.policy.cfg
        size = cfg.image_size
        images = [torch.zeros(batch, size, size, 3, dtype=torch.uint8) for _ in self.cameras]
        tokens, mask = self.policy.tokenizer(["touch the red cube"] * batch)
        state = self.policy.state_mean.expand(batch, -1).clone()
        if not self.separate:
            return (*images, state, torch.as_tensor(tokens), torch.as_tensor(mask))
        encoding = cast(InstructionEncoding, self.policy)
        with torch.no_grad():
            features = encoding.encode_instruction(torch.as_tensor(tokens), torch.as_tensor(mask))
        return (*images, state, features, torch.as_tensor(mask))


class OnnxInstructionEncoder(nn.Module):
    """Export wrapper of a policy's instruction encoder (``instruction_encoder.onnx``): inputs
    ``tokens`` and ``token_mask`` int64 ``(B, max_tokens)``, output ``instruction`` float32
    ``(B, max_tokens, F)`` (padding rows zero). The runtime runs it once per new instruction."""

    input_names: ClassVar[list[str]] = ["tokens", "token_mask"]
    output_names: ClassVar[list[str]] = ["instruction"]

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.encoder(tokens, token_mask))
