"""``policy.preset`` and ``policy.weights: random`` for hub-vlm policies: the published SmolVLM
architectures (checked on the meta device: no memory, no download), the tiny preset built with
random weights, what the checkpoint records, and the config errors that name the fields."""

from __future__ import annotations

import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.config import ConfigError, load_config
from stages.policy import presets
from stages.policy.base import BatchedObservation
from stages.policy.checkpoint import (
    CheckpointError,
    check_base,
    load_policy,
    new_policy,
    read_policy_meta,
)
from stages.policy.config import PRESET_NAMES, PolicyConfig
from stages.policy.hub_vla import BackboneError, vision_patches
from stages.policy.types import policy_type
from tests.conftest import TINY_CONFIG
from tests.stages.tiny_models import TINY_VLM_POLICY, save_tiny_idefics3, tiny_random_vlm

ROOT = Path(__file__).resolve().parents[2]


def observations(batch: int = 2) -> BatchedObservation:
    rng = np.random.default_rng(0)
    return BatchedObservation(
        images={"scene": rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)},
        state=rng.normal(size=(batch, 6)).astype(np.float32),
        instruction=["touch the red cube"] * batch,
    )


@pytest.mark.parametrize(
    ("name", "parameters", "text_width"),
    [("smolvlm-256m", 228_099_648, 576), ("smolvlm-500m", 460_173_504, 960)],
)
def test_the_smolvlm_presets_have_the_published_architecture(
    name: str, parameters: int, text_width: int
) -> None:
    """Sized as SmolVLM-256M/500M-Instruct's configs (the module docstring cites them): built on
    the meta device, the parameter count is the published one less the untied LM head."""
    from transformers import Idefics3Model

    preset = presets.get_preset(name)
    config = presets.idefics3_config(preset, 25)
    with torch.device("meta"):
        model = Idefics3Model(config)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert parameters + 49280 * text_width == pytest.approx(int(name[8:11]) * 1e6, rel=0.03)
    assert preset.image_tokens == 64  # 512 px / 16 = 32 patches a side, pixel shuffle by 4
    assert config.text_config.vocab_size == 49280  # our 25-word tokenizer uses the first ids


def test_the_1b_preset_is_past_protobufs_2_gb_limit_with_smolvlms_vision_tower() -> None:
    """The 1 B systems preset: SmolVLM's SigLIP tower and connector, a TinyLlama-1.1B-shaped
    language model; its FP32 weights (4.4 GiB) are past ONNX's 2 GB protobuf limit, so its
    export takes the external-data path."""
    from transformers import Idefics3Model

    config = presets.idefics3_config(presets.get_preset("idefics3-1b"), 25)
    with torch.device("meta"):
        model = Idefics3Model(config)
    sizes = {
        part: sum(p.numel() for n, p in model.named_parameters() if n.startswith(part))
        for part in ("vision_model", "connector", "text_model")
    }
    assert sizes == {
        "vision_model": 86_433_024,
        "connector": 25_165_824,
        "text_model": 1_069_901_824,
    }
    assert sum(sizes.values()) * 4 > 2**31


def test_preset_names_are_the_configs_choices() -> None:
    literal = typing.get_args(typing.get_args(PolicyConfig.model_fields["preset"].annotation)[0])
    assert literal == PRESET_NAMES == tuple(presets.PRESETS)
    with pytest.raises(presets.PresetError, match="'huge': no such preset; known: smolvlm-256m"):
        presets.get_preset("huge")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["policy.type=hub-vlm"],
            "needs policy.backbone .* or policy.weights: random with a policy.preset",
        ),
        (["policy.type=hub-vlm", "policy.weights=random"], "'random' needs policy.preset"),
        (
            [
                "policy.type=hub-vlm",
                "policy.weights=random",
                "policy.preset=tiny",
                "policy.backbone=/models/smolvlm",
            ],
            "policy.weights 'random' and policy.backbone '/models/smolvlm' contradict",
        ),
        (["policy.preset=tiny"], "policy.preset 'tiny' applies to policy.type 'hub-vlm' only"),
        (["policy.weights=random"], "policy.weights 'random' applies to policy.type 'hub-vlm'"),
        (["policy.type=hub-vlm", "policy.preset=big"], "field 'policy.preset' = 'big'"),
    ],
)
def test_a_hub_vlm_without_weights_or_random_is_refused_naming_the_field(
    sets: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TINY_CONFIG, sets)


@pytest.mark.parametrize(
    ("name", "preset"),
    [("vla-256m", "smolvlm-256m"), ("vla-500m", "smolvlm-500m"), ("vla-1b", "idefics3-1b")],
)
def test_the_shipped_vla_configs_are_random_weight_systems_tests(name: str, preset: str) -> None:
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert (cfg.policy.type, cfg.policy.preset, cfg.policy.random_weights) == (
        "hub-vlm",
        preset,
        True,
    )
    assert cfg.model_name == f"{name}-policy"  # never mixed with demo-policy's versions


def test_random_weights_build_the_tiny_preset_and_say_so_in_the_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    ref = tiny_random_vlm(tmp_path / "ckpt")
    assert ref.base is not None and (ref.base.kind, ref.base.path) == ("random", "tiny")
    meta = read_policy_meta(ref.path)
    assert meta["config"]["random_weights"] is True and meta["config"]["preset"] == "tiny"
    assert meta["config"]["backbone"] == "" and meta["trainable"] == "lora"
    # Only adapters and heads are saved: the backbone is built again from the preset.
    assert not any(n.startswith("backbone.") and "lora_" not in n for n in meta["tensors"])
    # What keys a fine-tune: the same base.
    assert ref.base == policy_type(TINY_VLM_POLICY.type).frozen_base(TINY_VLM_POLICY, "touch")
    assert check_base(Path(ref.path), ref.base) == {}  # robo-pipe verify's check

    loaded = load_policy(ref.path)
    assert loaded.cfg.random_weights and loaded.cfg.preset == "tiny"
    again = load_policy(ref.path)
    obs = observations()
    np.testing.assert_array_equal(loaded.predict_chunk(obs), again.predict_chunk(obs))
    assert loaded.predict_chunk(obs).shape == (2, 3, 6)


def test_a_random_base_built_differently_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch that initialises differently (here: another seed) gives another backbone: the
    checkpoint's adapters were trained on the first, so loading refuses it by its hash."""
    ref = tiny_random_vlm(tmp_path / "ckpt")
    monkeypatch.setattr(presets, "RANDOM_SEED", presets.RANDOM_SEED + 1)
    with pytest.raises(CheckpointError, match=r"random-weight preset tiny has hash .*refusing"):
        load_policy(ref.path)


def test_the_random_backbone_leaves_the_callers_rng_alone() -> None:
    preset = presets.get_preset("tiny")
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    first, digest = presets.random_backbone(preset, 25)
    assert torch.equal(torch.rand(3), expected)
    second, again = presets.random_backbone(preset, 25)
    assert digest == again == presets.weights_hash(second)
    for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_preset_checks_a_loaded_backbone(tmp_path: Path) -> None:
    backbone = save_tiny_idefics3(tmp_path / "tiny-smolvlm")
    fits = PolicyConfig(type="hub-vlm", backbone=str(backbone), preset="tiny", chunk_len=3)
    policy, base = new_policy(fits, ["scene"], 32, "rp5", 6, 6)
    assert base is not None and base.kind == "hub"
    assert policy.cfg.preset == "tiny" and not policy.cfg.random_weights
    wrong = fits.model_copy(update={"preset": "smolvlm-256m"})
    with pytest.raises(BackboneError, match=r"not the architecture of policy\.preset") as err:
        new_policy(wrong, ["scene"], 32, "rp5", 6, 6)
    assert "text_config.hidden_size 48 (preset 576)" in str(err.value)
    assert "vision_config.image_size 32 (preset 512)" in str(err.value)
    assert "scale_factor 2 (preset 4)" in str(err.value)


def test_the_vision_tower_written_out_is_the_towers_own_forward() -> None:
    """hub_vla.vision_patches (plain enough to export) computes what the Idefics3 tower does on
    full-size images, and the random backbone's tower is a real one (not a stand-in)."""
    backbone, _ = presets.random_backbone(presets.get_preset("tiny"), 25)
    tower = backbone.vision_model
    size = int(backbone.config.vision_config.image_size)
    pixels = torch.rand(2, 3, size, size) * 2 - 1
    with torch.no_grad():
        expected = tower(pixel_values=pixels).last_hidden_state
        written = vision_patches(tower, pixels)
    assert written.shape == expected.shape and expected.shape[1] > 1
    torch.testing.assert_close(written, expected, rtol=0, atol=1e-5)
