"""``policy.type: hub-vlm``: a pretrained vision-language backbone with LoRA and our action head.

The backbone is an Idefics3-architecture model (SmolVLM, Idefics3) loaded with
``transformers.AutoModel`` from a local directory or a hub id, together with its tokenizer:

    images -> resize to the vision tower's size, scale to [-1, 1] -> vision tower -> connector
           -> image tokens (already in the language model's width)
    instruction -> the backbone's tokenizer -> its input embeddings          -> tokens
    state -> normalise -> state_proj                                         -> 1 token
    chunk_len learned action queries                                         -> tokens
    all tokens -> the backbone's language model (LoRA on q/k/v/o and MLP projections)
    action-query outputs -> action head (Gaussian over the chunk)

The backbone stays frozen; adapters, the state projection, the action queries and the heads
train. Its architecture may be named by ``policy.preset`` (:mod:`stages.policy.presets`:
SmolVLM-256M, SmolVLM-500M, tiny), which checks a loaded backbone, or is built with random
weights where none can be had (``policy.weights: random``, a systems test). Nothing here
downloads in tests: they save the tiny preset to a temporary directory and load it through
:func:`load_backbone`, the same path a hub id takes, or build it with random weights.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from robo_pipe.errors import RoboPipeError
from stages.policy.base import Encoded, Images, Normalizer, Tensor, VLAPolicy
from stages.policy.config import VLAConfig


class HubTokenizer:
    """A ``transformers`` tokenizer padded/truncated to ``max_tokens`` (the policy interface)."""

    def __init__(self, tokenizer: Any, max_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        if tokenizer.pad_token is None:  # decoder-only vocabularies often have none
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token

    @classmethod
    def load(cls, directory: str | Path, max_tokens: int) -> HubTokenizer:
        """Load a tokenizer saved with :meth:`save` (or a backbone directory)."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(directory)), max_tokens)

    def save(self, directory: str | Path) -> None:
        """Write the tokenizer files (``save_pretrained``) into ``directory``."""
        self.tokenizer.save_pretrained(str(directory))

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return len(self.tokenizer)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask (1 = real token), int64 ``(len(texts), max_tokens)``."""
        enc = self.tokenizer(
            texts,
            padding="max_length",
            truncation=True,
            max_length=self.max_tokens,
            return_tensors="np",
        )
        return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)


class BackboneError(RoboPipeError, ValueError):
    """``policy.backbone`` names no usable pretrained VLM."""


def resolve_backbone(backbone: str) -> Path:
    """A local directory, or a hub id resolved to its local snapshot (downloaded if needed)."""
    path = Path(backbone).expanduser()
    if path.is_dir():
        return path.resolve()
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(backbone))
    except Exception as err:  # not found, offline, gated: the user named something unusable
        raise BackboneError(
            f"policy.backbone {backbone!r}: not a local directory, and the hub download failed "
            f"({type(err).__name__}: {err})"
        ) from err


def backbone_hash(directory: Path) -> str:
    """sha256 over the backbone's config and weight files (names and bytes), streamed. A
    backbone is hashed once per process: again only when a file's size or mtime changed (it is
    large, and building, loading and keying a fine-tune each ask for its hash)."""
    files = sorted(
        f for f in directory.iterdir() if f.suffix in {".json", ".safetensors"} and f.is_file()
    )
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    key = (str(directory.resolve()), stamp)
    if key not in _BACKBONE_HASHES:
        digest = hashlib.sha256()
        for file in files:
            digest.update(file.name.encode())
            with file.open("rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
        _BACKBONE_HASHES[key] = digest.hexdigest()
    return _BACKBONE_HASHES[key]


_BACKBONE_HASHES: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}
""":func:`backbone_hash` by directory and its files' (name, size, mtime)."""


def load_backbone(directory: Path) -> Any:
    """The pretrained Idefics3-style backbone (``transformers.AutoModel``), in eval mode."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(directory), dtype=torch.float32)
    for attr in ("vision_model", "connector", "text_model"):
        if not hasattr(model, attr):
            raise BackboneError(
                f"{directory}: backbone {type(model).__name__} is not an Idefics3-style VLM "
                f"(no .{attr}); supported: Idefics3 / SmolVLM"
            )
    return model.eval()


def vision_patches(vision_model: Any, pixels: Tensor) -> Tensor:
    """The Idefics3 vision tower's patch features ``(B, patches, width)`` of images ``pixels``
    ``(B, 3, S, S)`` in [-1, 1] at the tower's own size S.

    What ``vision_model(pixel_values=pixels).last_hidden_state`` computes, written out for
    images that fill the tower's input: every patch is real, so patch i sits at position i and
    no attention mask is needed. The tower's own variable-resolution path (patch positions
    bucketed from a patch mask) traces into an ONNX graph that indexes with a float tensor.
    """
    embeddings = vision_model.embeddings
    patches = embeddings.patch_embedding(pixels).flatten(2).transpose(1, 2)
    hidden = patches + embeddings.position_embedding.weight[None]
    hidden = vision_model.encoder(inputs_embeds=hidden).last_hidden_state
    return cast(Tensor, vision_model.post_layernorm(hidden))


class HubVLA(VLAPolicy):
    """A pretrained VLM backbone + state token + action queries + our heads."""

    head_names: ClassVar[tuple[str, ...]] = (*VLAPolicy.head_names, "state_proj", "action_queries")
    lora_target_modules: ClassVar[str] = (
        r"backbone\.text_model\..*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    )

    def __init__(
        self,
        cfg: VLAConfig,
        tokenizer: HubTokenizer,
        normalizer: Normalizer | None,
        backbone: Any,
    ) -> None:
        vision = backbone.config.vision_config
        width = int(backbone.config.text_config.hidden_size)
        self.vision_size = int(vision.image_size)
        per_camera = (self.vision_size // vision.patch_size) ** 2 // backbone.config.scale_factor**2
        super().__init__(cfg, tokenizer, normalizer, width, per_camera * len(cfg.cameras))
        self.backbone = backbone
        self.state_proj = nn.Linear(cfg.state_dim, width)
        self.action_queries = nn.Parameter(torch.zeros(1, cfg.chunk_len, width))
        nn.init.normal_(self.action_queries, std=0.02)

    def encode(self, images: Images, state: Tensor, tokens: Tensor, token_mask: Tensor) -> Encoded:
        image_tokens = []
        for cam in self.cfg.cameras:
            pixels = images[cam].permute(0, 3, 1, 2).to(torch.float32) / 255.0
            pixels = F.interpolate(
                pixels, size=(self.vision_size, self.vision_size), mode="bilinear"
            )
            patches = vision_patches(self.backbone.vision_model, pixels * 2.0 - 1.0)
            image_tokens.append(self.backbone.connector(patches))
        vision = torch.cat(image_tokens, dim=1)
        words = self.backbone.text_model.get_input_embeddings()(tokens)
        batch = state.shape[0]
        queries = self.action_queries.expand(batch, -1, -1)
        sequence = torch.cat([vision, words, self.state_proj(state)[:, None], queries], dim=1)
        ones_before = torch.ones(batch, vision.shape[1], dtype=token_mask.dtype)
        ones_after = torch.ones(batch, 1 + self.cfg.chunk_len, dtype=token_mask.dtype)
        attention = torch.cat([ones_before, token_mask, ones_after], dim=1)
        hidden = self.backbone.text_model(
            inputs_embeds=sequence, attention_mask=attention
        ).last_hidden_state
        return hidden[:, -self.cfg.chunk_len :], vision
