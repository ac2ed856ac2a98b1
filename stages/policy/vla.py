"""The default VLA: a small vision-language-action model that trains on 2 CPU cores in minutes.

    images (uint8, per camera) -> conv encoder, FiLM from the instruction, keypoints -> tokens
    instruction -> tokenizer -> token embeddings                                  -> tokens
    state (robot units) -> normalise -> state token                               -> 1 token
    chunk_len learned action queries                                              -> tokens
    all tokens -> transformer (BERT-style, built with transformers from a config)
    action-query outputs -> Gaussian head: mean (chunk_len x action_dim), learned log-std
                         -> de-normalise -> actions in robot units

Why this shape (see shared/FACTS.md): on CPU a transformer over raw patch tokens learns spatial
grounding far too slowly; letting the instruction modulate the convolutional features (FiLM)
and handing the transformer a few spatial tokens learns "which object" in minutes. The
transformer's attention and MLP projections are where LoRA adapters go when fine-tuning.

Normalisation of state and de-normalisation of actions are buffers inside the module (from the
dataset's ``stats.json``), so an exported graph needs no training code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import BertConfig, BertModel

VISION_TOKENS = 4
"""Tokens each camera contributes to the transformer."""


@dataclass(frozen=True)
class VLAConfig:
    """Architecture of the default VLA (saved with every checkpoint)."""

    cameras: tuple[str, ...] = ("scene",)
    """Camera streams the model sees, in order."""
    image_size: int = 64
    """Square image side, pixels (a multiple of 16)."""
    state_dim: int = 6
    action_dim: int = 6
    chunk_len: int = 4
    """Actions predicted per inference."""
    vocab_size: int = 32
    max_tokens: int = 12
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    conv_channels: tuple[int, int, int] = (32, 64, 64)
    init_log_std: float = -1.0
    """Initial log standard deviation of the action distribution (normalised units)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VLAConfig:
        """Inverse of :meth:`to_dict` (lists become tuples)."""
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**fields)


class FiLMConvEncoder(nn.Module):
    """Conv stack modulated by the instruction (FiLM), read out as spatial-softmax keypoints.

    Input: float images ``(B, 3, H, W)`` in [0, 1] and a text vector ``(B, d)``.
    Output: ``(B, VISION_TOKENS, d)``. Each channel of the last feature map (H/4 x W/4) becomes
    the expected image position of its activation (a keypoint in [-1, 1]^2): sub-pixel
    positions survive, where average-pooling to a coarse grid loses them.
    """

    def __init__(self, cfg: VLAConfig) -> None:
        super().__init__()
        c1, c2, c3 = cfg.conv_channels
        self.conv1 = nn.Conv2d(3, c1, 5, stride=2, padding=2)  # H/2
        self.conv2 = nn.Conv2d(c1, c2, 3, stride=2, padding=1)  # H/4
        self.conv3 = nn.Conv2d(c2, c3, 3, stride=1, padding=1)  # H/4
        self.film2 = nn.Linear(cfg.d_model, 2 * c2)
        self.film3 = nn.Linear(cfg.d_model, 2 * c3)
        side = cfg.image_size // 4
        grid = torch.linspace(-1.0, 1.0, side)
        self.grid_x: torch.Tensor
        self.grid_y: torch.Tensor
        self.register_buffer("grid_x", grid.repeat(side))  # (side*side,), row-major
        self.register_buffer("grid_y", grid.repeat_interleave(side))
        self.proj = nn.Linear(2 * c3 + c3, VISION_TOKENS * cfg.d_model)
        self.d_model = cfg.d_model

    @staticmethod
    def _film(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        gamma, beta = params[:, :, None, None].chunk(2, dim=1)
        return x * (1 + gamma) + beta

    def forward(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(images))
        x = torch.relu(self._film(self.conv2(x), self.film2(text)))
        x = self._film(self.conv3(x), self.film3(text))  # (B, C, h, w)
        flat = x.flatten(2)  # (B, C, h*w)
        attention = torch.softmax(flat, dim=-1)
        keypoints = torch.cat([attention @ self.grid_x, attention @ self.grid_y], dim=1)
        presence = flat.amax(dim=-1)  # how strongly each feature fired
        features = torch.cat([keypoints, presence], dim=1)
        return self.proj(features).view(-1, VISION_TOKENS, self.d_model)


@dataclass
class Normalizer:
    """Per-dimension mean/std of state and action (robot units), from dataset stats."""

    state_mean: list[float] = field(default_factory=list)
    state_std: list[float] = field(default_factory=list)
    action_mean: list[float] = field(default_factory=list)
    action_std: list[float] = field(default_factory=list)

    @classmethod
    def from_stats(cls, stats: dict[str, Any], min_std: float = 1e-3) -> Normalizer:
        """From a LeRobot ``stats.json`` dict (``observation.state`` and ``action``).

        ``min_std`` (robot units) floors each std: a dimension the demonstrations hold constant
        (the expert's gripper opening) would otherwise turn float rounding noise into
        unit-variance targets -- measured: a sixth of the BC loss was that noise.
        """

        def floored(values: list[float]) -> list[float]:
            return [max(float(v), min_std) for v in values]

        return cls(
            state_mean=list(stats["observation.state"]["mean"]),
            state_std=floored(stats["observation.state"]["std"]),
            action_mean=list(stats["action"]["mean"]),
            action_std=floored(stats["action"]["std"]),
        )


class DefaultVLA(nn.Module):
    """The default VLA (see module docstring). All tensors are batch-first.

    ``forward`` inputs: ``images`` camera -> uint8 ``(B, H, W, 3)``; ``state`` float ``(B,
    state_dim)`` in robot units; ``tokens``/``token_mask`` int64 ``(B, max_tokens)``.
    Output: action mean in **normalised** units ``(B, chunk_len, action_dim)`` and the
    log-std ``(action_dim,)``; :meth:`denormalize` maps the mean to robot units.
    """

    state_mean: torch.Tensor  # buffers (normalisation statistics)
    state_std: torch.Tensor
    action_mean: torch.Tensor
    action_std: torch.Tensor

    def __init__(self, cfg: VLAConfig, normalizer: Normalizer | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.token_embedding = nn.Embedding(cfg.vocab_size, d)
        self.token_pos = nn.Parameter(torch.zeros(1, cfg.max_tokens, d))
        self.encoders = nn.ModuleDict({cam: FiLMConvEncoder(cfg) for cam in cfg.cameras})
        self.state_proj = nn.Linear(cfg.state_dim, d)
        self.action_queries = nn.Parameter(torch.zeros(1, cfg.chunk_len, d))
        nn.init.normal_(self.token_pos, std=0.02)
        nn.init.normal_(self.action_queries, std=0.02)
        self.transformer = BertModel(
            BertConfig(
                hidden_size=d,
                num_hidden_layers=cfg.n_layers,
                num_attention_heads=cfg.n_heads,
                intermediate_size=4 * d,
                vocab_size=1,  # inputs arrive as embeddings
                max_position_embeddings=VISION_TOKENS * len(cfg.cameras)
                + cfg.max_tokens
                + 1
                + cfg.chunk_len,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            ),
            add_pooling_layer=False,
        )
        self.action_head = nn.Linear(d, cfg.action_dim)
        self.log_std = nn.Parameter(torch.full((cfg.action_dim,), cfg.init_log_std))
        norm = normalizer or Normalizer(
            [0.0] * cfg.state_dim,
            [1.0] * cfg.state_dim,
            [0.0] * cfg.action_dim,
            [1.0] * cfg.action_dim,
        )
        self.register_buffer("state_mean", torch.tensor(norm.state_mean, dtype=torch.float32))
        self.register_buffer(
            "state_std", torch.tensor(norm.state_std, dtype=torch.float32).clamp_min(1e-6)
        )
        self.register_buffer("action_mean", torch.tensor(norm.action_mean, dtype=torch.float32))
        self.register_buffer(
            "action_std", torch.tensor(norm.action_std, dtype=torch.float32).clamp_min(1e-6)
        )

    def forward(
        self,
        images: dict[str, torch.Tensor],
        state: torch.Tensor,
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mask = token_mask.to(torch.float32)
        words = self.token_embedding(tokens) + self.token_pos
        text = (words * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)
        vision = [
            self.encoders[cam](images[cam].permute(0, 3, 1, 2).to(torch.float32) / 255.0, text)
            for cam in self.cfg.cameras
        ]
        state_token = self.state_proj((state - self.state_mean) / self.state_std)[:, None]
        batch = state.shape[0]
        queries = self.action_queries.expand(batch, -1, -1)
        sequence = torch.cat([*vision, words, state_token, queries], dim=1)
        ones = torch.ones(batch, sequence.shape[1] - words.shape[1], dtype=mask.dtype)
        n_vision = VISION_TOKENS * len(self.cfg.cameras)
        attention = torch.cat([ones[:, :n_vision], mask, ones[:, n_vision:]], dim=1)
        hidden = self.transformer(
            inputs_embeds=sequence, attention_mask=attention
        ).last_hidden_state
        mean = self.action_head(hidden[:, -self.cfg.chunk_len :])
        return mean, self.log_std

    def denormalize(self, mean: torch.Tensor) -> torch.Tensor:
        """Normalised action mean -> robot units, same shape."""
        return mean * self.action_std + self.action_mean

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Robot-unit actions -> normalised units, same shape."""
        return (actions - self.action_mean) / self.action_std
