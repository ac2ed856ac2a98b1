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

LoRA (:meth:`VLAPolicy.add_lora`) adapts the transformer's query/key/value/output and MLP
projections and, by default, the vision encoder (conv layers, FiLM projections, token projection).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from transformers import BertConfig, BertModel

from stages.policy.base import (
    Encoded,
    Images,
    Normalizer,
    PolicyTokenizer,
    Tensor,
    VLAPolicy,
    masked_mean,
)
from stages.policy.config import LoraSettings, VLAConfig

VISION_TOKENS = 4
"""Tokens each camera contributes to the transformer."""


def token_transformer(cfg: VLAConfig, vision_tokens: int) -> BertModel:
    """The BERT-style stack (built with transformers from a config) that reads
    ``vision_tokens`` image tokens, ``cfg.max_tokens`` instruction tokens, the state token and
    ``cfg.chunk_len`` action queries (:func:`run_token_transformer`)."""
    d = cfg.d_model
    transformer = BertModel(
        BertConfig(
            hidden_size=d,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads,
            intermediate_size=4 * d,
            vocab_size=1,  # inputs arrive as embeddings
            max_position_embeddings=vision_tokens + cfg.max_tokens + 1 + cfg.chunk_len,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
        add_pooling_layer=False,
    )
    # BERT's word-embedding table: the stack is fed embeddings (``inputs_embeds``), so the
    # table never gets a gradient, and DDP refuses a parameter that never does (training on
    # two or more workers with every parameter trainable). Checkpoints written before it
    # was removed still load (``checkpoint.LEGACY_UNUSED_TENSORS``).
    del transformer.embeddings.word_embeddings
    return transformer


def run_token_transformer(
    transformer: BertModel,
    vision: torch.Tensor,
    words: torch.Tensor,
    word_mask: torch.Tensor,
    state_token: torch.Tensor,
    queries: torch.Tensor,
) -> torch.Tensor:
    """[vision ``(B, V, d)``, words ``(B, L, d)`` (float mask ``(B, L)``, 1 = real), state
    token ``(B, 1, d)``, action queries ``(B, C, d)``] -> the queries' outputs ``(B, C, d)``."""
    sequence = torch.cat([vision, words, state_token, queries], dim=1)
    batch, n_vision = vision.shape[0], vision.shape[1]
    ones = torch.ones(batch, sequence.shape[1] - words.shape[1], dtype=word_mask.dtype)
    attention = torch.cat([ones[:, :n_vision], word_mask, ones[:, n_vision:]], dim=1)
    hidden = transformer(inputs_embeds=sequence, attention_mask=attention).last_hidden_state
    return hidden[:, -queries.shape[1] :]


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


class DefaultVLA(VLAPolicy):
    """The default VLA (see module docstring); heads and the rest of the interface come from
    :class:`VLAPolicy`."""

    lora_target_modules: ClassVar[str] = r"transformer\..*\.(query|key|value|dense)"

    def __init__(
        self,
        cfg: VLAConfig,
        tokenizer: PolicyTokenizer,
        normalizer: Normalizer | None = None,
    ) -> None:
        super().__init__(cfg, tokenizer, normalizer, cfg.d_model, VISION_TOKENS * len(cfg.cameras))
        d = cfg.d_model
        self.token_embedding = nn.Embedding(cfg.vocab_size, d)
        self.token_pos = nn.Parameter(torch.zeros(1, cfg.max_tokens, d))
        self.encoders = nn.ModuleDict({cam: FiLMConvEncoder(cfg) for cam in cfg.cameras})
        self.state_proj = nn.Linear(cfg.state_dim, d)
        self.action_queries = nn.Parameter(torch.zeros(1, cfg.chunk_len, d))
        nn.init.normal_(self.token_pos, std=0.02)
        nn.init.normal_(self.action_queries, std=0.02)
        self.transformer = token_transformer(cfg, VISION_TOKENS * len(cfg.cameras))

    def lora_targets(self, settings: LoraSettings) -> str:
        if settings.vision:
            return rf"{self.lora_target_modules}|encoders\.\w+\.(conv2|conv3|film2|film3|proj)"
        return self.lora_target_modules

    def encode(self, images: Images, state: Tensor, tokens: Tensor, token_mask: Tensor) -> Encoded:
        words = self.token_embedding(tokens) + self.token_pos
        mask = token_mask.to(torch.float32)  # 1 = a word: the transformer attends to it
        text = masked_mean(words, mask)
        vision = torch.cat(
            [
                self.encoders[cam](images[cam].permute(0, 3, 1, 2).to(torch.float32) / 255.0, text)
                for cam in self.cfg.cameras
            ],
            dim=1,
        )
        queries = self.action_queries.expand(state.shape[0], -1, -1)
        features = run_token_transformer(
            self.transformer, vision, words, mask, self.state_proj(state)[:, None], queries
        )
        return features, vision
