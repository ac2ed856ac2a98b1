"""Backbone architectures for ``policy.type: hub-vlm`` (``policy.preset``), and building one
with random weights when no pretrained weights can be had (``policy.weights: random``).

The presets are Idefics3 models (``transformers.Idefics3Model``: SigLIP vision tower, pixel-
shuffle connector, Llama language model), sized as published:

================  ===================================  ============================================
preset            vision tower + connector             language model
================  ===================================  ============================================
``smolvlm-256m``  SigLIP base/16 at 512 px: 768 wide,  SmolLM2-135M: 576 wide, 30 layers, 9 heads
                  12 layers, 12 heads, 3072 MLP;       (3 kv), 1536 MLP, vocab 49280,
                  scale factor 4: 1024 patches -> 64   RoPE theta 100000, RMSNorm eps 1e-5
                  image tokens per camera
``smolvlm-500m``  the same                             SmolLM2-360M: 960 wide, 32 layers, 15 heads
                                                       (5 kv), 2560 MLP, vocab 49280, same RoPE/eps
``idefics3-1b``   the same                             TinyLlama-1.1B's shape: 2048 wide, 22 layers,
                                                       32 heads (4 kv), 5632 MLP, RoPE theta 10000;
                                                       SmolLM2's vocabulary (49280)
``tiny``          32 px, patch 8, 32 wide, 1 layer     48 wide, 2 layers, 4 heads (2 kv), 96 MLP,
                                                       our word tokenizer's vocabulary (tests)
================  ===================================  ============================================

Where the figures come from: the ``config.json`` of ``HuggingFaceTB/SmolVLM-256M-Instruct`` and
``HuggingFaceTB/SmolVLM-500M-Instruct`` on the Hugging Face hub, whose model cards name their
parts (``google/siglip-base-patch16-512`` with ``HuggingFaceTB/SmolLM2-135M-Instruct``, resp.
``SmolLM2-360M-Instruct``; "64 visual tokens to encode image patches of size 512x512"). Our
machines reach no hub: the values were checked (issue 40) against those model cards and against
the published configs as quoted in public code (SmolVLM-256M: ``text_config`` 576 / 1536 / 30
layers / 9 heads / 3 kv / vocab 49280 / rope_theta 100000, ``vision_config`` 768 / 3072 / 12 /
12 / 512 px / patch 16, ``scale_factor`` 4; SmolVLM(2)-500M: 960 / 2560 / 32 / 15 / 5 / 49280).

No SmolVLM has a billion parameters (the family goes from 500 M to 2.2 B, whose SigLIP
so400m and SmolLM2-1.7B would not export in this machine's 24 GiB): ``idefics3-1b`` is the
smallest published language-model shape at that size (``TinyLlama/TinyLlama_v1.1``
config.json) behind the same vision tower, for systems figures at 1 B only.

Built here (``Idefics3Model``, which has no language-model head) they have 228,099,648
(vision 86.4 M, connector 7.1 M, language model 134.6 M) and 460,173,504 parameters; the
published "256M" and "500M" also count the untied LM head (49280 x width: 28.4 M, 47.3 M),
which a policy does not use.

Random weights: :func:`random_backbone` builds a preset with a fixed seed
(:data:`RANDOM_SEED`, on a forked RNG so the caller's stream is untouched), so every
random-weight checkpoint of a preset sits on the same backbone; a checkpoint records its
:func:`weights_hash` as its base (``BaseRef("random", <preset>, <hash>)``), and loading builds
it again and refuses it if the hash differs (a torch that initialises differently). The
tokenizer is our instruction word tokenizer wrapped as a ``PreTrainedTokenizerFast``: a random
language model has no vocabulary of its own worth keeping.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from robo_pipe.errors import RoboPipeError
from stages.policy.config import PRESET_NAMES
from stages.policy.hub_vla import BackboneError

RANDOM_SEED = 0
"""Seed every random-weight backbone is built with (one backbone per preset)."""


class PresetError(RoboPipeError, ValueError):
    """A preset name that does not exist."""


@dataclass(frozen=True)
class Preset:
    """One backbone architecture (the ``Idefics3Config`` arguments that size it)."""

    name: str
    """``policy.preset``: ``smolvlm-256m``, ``smolvlm-500m``, ``tiny``."""
    source: str
    """Where the figures come from."""
    vision: Mapping[str, int]
    """``vision_config``: the SigLIP tower."""
    text: Mapping[str, Any]
    """``text_config``: the Llama language model (``vocab_size`` apart)."""
    scale_factor: int
    """Pixel-shuffle factor of the connector: image tokens = (image / patch)^2 / factor^2."""
    vocab_size: int | None
    """Embedding rows of the language model; None: the tokenizer's (the tiny preset)."""

    @property
    def image_tokens(self) -> int:
        """Image tokens per camera the connector hands the language model."""
        side = self.vision["image_size"] // self.vision["patch_size"]
        return side * side // self.scale_factor**2


_SIGLIP_BASE_512 = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 512,
    "patch_size": 16,
}
_SMOLLM2 = {"model_type": "llama", "rope_theta": 100000.0, "rms_norm_eps": 1e-5}
_SMOLLM2_POSITIONS = 8192

PRESETS: dict[str, Preset] = {
    "smolvlm-256m": Preset(
        name="smolvlm-256m",
        source="HuggingFaceTB/SmolVLM-256M-Instruct config.json (SigLIP base/16-512 + "
        "SmolLM2-135M)",
        vision=_SIGLIP_BASE_512,
        text={
            **_SMOLLM2,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": _SMOLLM2_POSITIONS,
        },
        scale_factor=4,
        vocab_size=49280,
    ),
    "smolvlm-500m": Preset(
        name="smolvlm-500m",
        source="HuggingFaceTB/SmolVLM-500M-Instruct config.json (SigLIP base/16-512 + "
        "SmolLM2-360M)",
        vision=_SIGLIP_BASE_512,
        text={
            **_SMOLLM2,
            "hidden_size": 960,
            "intermediate_size": 2560,
            "num_hidden_layers": 32,
            "num_attention_heads": 15,
            "num_key_value_heads": 5,
            "max_position_embeddings": _SMOLLM2_POSITIONS,
        },
        scale_factor=4,
        vocab_size=49280,
    ),
    "idefics3-1b": Preset(
        name="idefics3-1b",
        source="SigLIP base/16-512 (as SmolVLM's) + a language model shaped as "
        "TinyLlama/TinyLlama_v1.1 config.json, SmolLM2's vocabulary",
        vision=_SIGLIP_BASE_512,
        text={
            "model_type": "llama",
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-5,
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "max_position_embeddings": 2048,
        },
        scale_factor=4,
        vocab_size=49280,
    ),
    "tiny": Preset(
        name="tiny",
        source="robo-pipe's test size (seconds to build, export and run)",
        vision={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        text={
            "model_type": "llama",
            "hidden_size": 48,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
        },
        scale_factor=2,
        vocab_size=None,
    ),
}
"""Every preset by name; the names are :data:`stages.policy.config.PRESET_NAMES`."""

assert tuple(PRESETS) == PRESET_NAMES, "policy.preset's Literal and PRESETS must agree"


def get_preset(name: str) -> Preset:
    """The preset called ``name``; :class:`PresetError` naming the known ones otherwise."""
    if name not in PRESETS:
        raise PresetError(f"policy.preset {name!r}: no such preset; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def word_tokenizer(task: str) -> Any:
    """Our instruction word tokenizer (:mod:`stages.policy.tokenizer`), trained on the task
    family ``task``'s instructions, as a ``transformers.PreTrainedTokenizerFast``: the tokenizer
    of a random-weight backbone."""
    from transformers import PreTrainedTokenizerFast

    from sim_scenes.tasks import task_family
    from stages.policy.tokenizer import PAD, UNK, InstructionTokenizer

    words = InstructionTokenizer.train(task_family(task).instructions()).tokenizer
    words.no_padding()  # the HubTokenizer pads, to the policy's max_tokens
    words.no_truncation()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token=PAD, unk_token=UNK)


def idefics3_config(preset: Preset, tokens: int) -> Any:
    """The ``transformers.Idefics3Config`` of ``preset`` for a tokenizer of ``tokens`` ids."""
    from transformers import Idefics3Config

    vocab = preset.vocab_size or tokens
    if tokens > vocab:
        raise PresetError(
            f"policy.preset {preset.name!r}: the tokenizer has {tokens} ids, more than the "
            f"preset's vocabulary of {vocab}"
        )
    return Idefics3Config(
        vision_config=dict(preset.vision),
        text_config={**preset.text, "vocab_size": vocab},
        scale_factor=preset.scale_factor,
    )


def random_backbone(preset: Preset, tokens: int) -> tuple[Any, str]:
    """``preset``'s architecture with random weights (seeded by :data:`RANDOM_SEED`), in eval
    mode, for a tokenizer of ``tokens`` ids; and its :func:`weights_hash`."""
    import torch
    from transformers import Idefics3Model

    config = idefics3_config(preset, tokens)
    with torch.random.fork_rng(devices=[]):  # the caller's RNG stream goes on untouched
        torch.manual_seed(RANDOM_SEED)
        model = Idefics3Model(config)
    digest = weights_hash(model)
    _RANDOM_HASHES[(preset.name, tokens)] = digest
    return model.eval(), digest


def random_backbone_hash(preset: Preset, tokens: int) -> str:
    """:func:`weights_hash` of :func:`random_backbone` (built once per process to find it)."""
    key = (preset.name, tokens)
    if key not in _RANDOM_HASHES:
        random_backbone(preset, tokens)
    return _RANDOM_HASHES[key]


_RANDOM_HASHES: dict[tuple[str, int], str] = {}
""":func:`random_backbone_hash` by (preset, tokenizer ids)."""


def weights_hash(model: Any) -> str:
    """sha256 over every tensor of ``model``'s state (name, dtype, shape, bytes), in order:
    what identifies a random-weight backbone (0.6 s for 228 M parameters)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().data)
    return digest.hexdigest()


def check_backbone(preset: Preset, config: Any, where: str) -> None:
    """Refuse a loaded backbone (its ``config``, from ``where``) whose architecture is not
    ``preset``'s, naming every field that differs (:class:`BackboneError`)."""
    differences = [
        f"{part}.{key} {_field(getattr(config, part), key)!r} (preset {value!r})"
        for part, wanted in (("vision_config", preset.vision), ("text_config", preset.text))
        for key, value in wanted.items()
        if key != "model_type" and _differs(_field(getattr(config, part), key), value)
    ]
    vocab = config.text_config.vocab_size
    if preset.vocab_size is not None and vocab != preset.vocab_size:
        differences.append(f"text_config.vocab_size {vocab!r} (preset {preset.vocab_size!r})")
    if config.scale_factor != preset.scale_factor:
        differences.append(f"scale_factor {config.scale_factor!r} (preset {preset.scale_factor!r})")
    if differences:
        raise BackboneError(
            f"policy.backbone {where}: not the architecture of policy.preset {preset.name!r}: "
            + "; ".join(differences)
        )


def _field(config: Any, key: str) -> Any:
    """``config.key``; ``rope_theta`` from ``rope_parameters`` where transformers keeps it."""
    if key == "rope_theta" and getattr(config, "rope_parameters", None):
        return config.rope_parameters.get("rope_theta")
    return getattr(config, key, None)


def _differs(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, float):  # read back from JSON: compare as numbers
        return actual is None or abs(float(actual) - wanted) > 1e-9 * max(1.0, abs(wanted))
    return bool(actual != wanted)
