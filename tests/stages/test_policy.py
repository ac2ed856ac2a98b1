"""The default VLA and its tokenizer: shapes, dtypes, saving, normalisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from stages.policy.tokenizer import InstructionTokenizer, task_family_corpus
from stages.policy.vla import DefaultVLA, FiLMConvEncoder, Normalizer, VLAConfig


def test_tokenizer_is_trained_saved_and_reloaded(tmp_path: Path) -> None:
    tok = InstructionTokenizer.train(task_family_corpus(), max_tokens=10)
    ids, mask = tok(["touch the red cube", "Tap the PURPLE banana"])
    assert ids.shape == mask.shape == (2, 10) and ids.dtype == np.int64
    assert mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    unk = tok.tokenizer.token_to_id("[UNK]")
    assert ids[1, 3] == unk and ids[1, 2] == tok.tokenizer.token_to_id("purple")
    assert len(set(ids[:, 2].tolist())) == 2, "colours get their own ids"
    tok.save(tmp_path / "tokenizer.json")
    again = InstructionTokenizer.load(tmp_path / "tokenizer.json", max_tokens=10)
    np.testing.assert_array_equal(again(["touch the red cube"])[0], ids[:1])


def test_vla_shapes_and_gradients() -> None:
    cfg = VLAConfig(
        cameras=("scene", "wrist"),
        image_size=32,
        vocab_size=30,
        chunk_len=3,
        d_model=32,
        n_heads=2,
        conv_channels=(8, 16, 16),
    )
    model = DefaultVLA(cfg)
    batch = 5
    images = {c: torch.randint(0, 256, (batch, 32, 32, 3), dtype=torch.uint8) for c in cfg.cameras}
    tokens = torch.randint(0, 30, (batch, cfg.max_tokens))
    mask = torch.ones(batch, cfg.max_tokens, dtype=torch.int64)
    mask[:, 6:] = 0
    mean, log_std = model(images, torch.randn(batch, 6), tokens, mask)
    assert mean.shape == (batch, 3, 6) and mean.dtype == torch.float32
    assert log_std.shape == (6,)
    mean.pow(2).mean().backward()
    wrist = model.encoders["wrist"]
    assert isinstance(wrist, FiLMConvEncoder) and wrist.conv1.weight.grad is not None
    assert model.token_embedding.weight.grad is not None


def test_instruction_changes_the_prediction() -> None:
    torch.manual_seed(0)
    model = DefaultVLA(VLAConfig(vocab_size=30, d_model=32, n_heads=2, conv_channels=(8, 16, 16)))
    images = {"scene": torch.randint(0, 256, (1, 64, 64, 3), dtype=torch.uint8).repeat(2, 1, 1, 1)}
    tokens = torch.tensor([[3, 2, 20, 8] + [0] * 8, [3, 2, 21, 8] + [0] * 8])
    mask = (tokens > 0).to(torch.int64)
    mean, _ = model(images, torch.zeros(2, 6), tokens, mask)
    assert not torch.allclose(mean[0], mean[1])


def test_normalisation_round_trip() -> None:
    norm = Normalizer([0.0] * 6, [1.0] * 6, [0.1] * 6, [0.5] * 6)
    model = DefaultVLA(VLAConfig(vocab_size=30, d_model=32, n_heads=2), norm)
    actions = torch.randn(4, 4, 6)
    torch.testing.assert_close(model.denormalize(model.normalize_actions(actions)), actions)


def test_constant_dimensions_do_not_blow_up_normalisation() -> None:
    stats = {
        "observation.state": {"mean": [0.0] * 6, "std": [0.5] * 6},
        "action": {"mean": [0.0] * 5 + [0.02], "std": [0.05] * 5 + [1.9e-6]},
    }
    norm = Normalizer.from_stats(stats)
    assert norm.action_std[-1] == 1e-3 and norm.action_std[0] == 0.05
