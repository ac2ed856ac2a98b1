"""The policy interface: default VLA and hub-VLM types, LoRA, checkpoints (verified on every
load, written whole or not at all), the export wrapper."""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
import shutil
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import robo_pipe.integrity
from robo_pipe.atomic import discard_dead_temporaries
from robo_pipe.errors import OutOfSpaceError
from robo_pipe.integrity import IntegrityError, file_sums, write_checksums
from sim_scenes import tasks
from sim_scenes.batched_env import BatchedObservation
from sim_scenes.touch_task import TOUCH, TouchTasks
from stages.finetune.checkpoints import (
    commit_checkpoint,
    latest_checkpoint,
    restore_training_state,
)
from stages.policy import checkpoint
from stages.policy.base import Normalizer, VLAPolicy
from stages.policy.checkpoint import (
    CheckpointError,
    checkpoint_hash,
    load_policy,
    new_policy,
    policy_files,
    save_policy,
    verify_checkpoint,
)
from stages.policy.config import LoraSettings, PolicyConfig, VLAConfig
from stages.policy.onnx_graph import as_onnx
from stages.policy.tokenizer import InstructionTokenizer
from stages.policy.types import BaseRef
from tests.robo_pipe.test_atomic import kill_at_every_step
from tests.stages.tiny_models import TINY_POLICY, save_tiny_idefics3

SIZE = 32


def observations(batch: int = 3, cameras: tuple[str, ...] = ("scene",)) -> BatchedObservation:
    rng = np.random.default_rng(0)
    return BatchedObservation(
        images={c: rng.integers(0, 256, (batch, SIZE, SIZE, 3), dtype=np.uint8) for c in cameras},
        state=rng.normal(size=(batch, 6)).astype(np.float32),
        instruction=["touch the red cube", "tap the blue ball", "reach the green block"][:batch],
    )


def tiny(cameras: tuple[str, ...] = ("scene",), norm: Normalizer | None = None) -> VLAPolicy:
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, cameras, SIZE, "rp5", 6, 6, norm)
    return policy


def test_tokenizer_is_trained_saved_and_reloaded(tmp_path: Path) -> None:
    tok = InstructionTokenizer.train(TOUCH.instructions(), max_tokens=10)
    ids, mask = tok(["touch the red cube", "Tap the PURPLE banana"])
    assert ids.shape == mask.shape == (2, 10) and ids.dtype == np.int64
    assert mask[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    unk = tok.tokenizer.token_to_id("[UNK]")
    assert ids[1, 3] == unk and ids[1, 2] == tok.tokenizer.token_to_id("purple")
    assert len(set(ids[:, 2].tolist())) == 2, "colours get their own ids"
    tok.save(tmp_path)
    again = InstructionTokenizer.load(tmp_path, max_tokens=10)
    np.testing.assert_array_equal(again(["touch the red cube"])[0], ids[:1])


def test_distribution_over_the_chunk_in_robot_units() -> None:
    norm = Normalizer([0.0] * 6, [1.0] * 6, [0.5] * 6, [2.0] * 6)
    policy = tiny(("scene", "wrist"), norm)
    dist = policy.distribution(observations(cameras=("scene", "wrist")))
    assert dist.mean.shape == (3, 3, 6) and dist.mean.dtype == torch.float32
    # std = exp(log_std) in normalised units times the action std (robot units)
    torch.testing.assert_close(dist.stddev[0, 0], torch.full((6,), 2.0 * np.exp(-1.0)))
    assert dist.log_prob(dist.mean).sum((-2, -1)).shape == (3,)
    chunk = policy.predict_chunk(observations(cameras=("scene", "wrist")))
    assert chunk.shape == (3, 3, 6) and chunk.dtype == np.float32
    np.testing.assert_allclose(chunk, dist.mean.detach().numpy(), atol=1e-6)


def test_instruction_changes_the_prediction() -> None:
    policy = tiny()
    obs = observations(2)
    same_scene = BatchedObservation(
        images={"scene": np.repeat(obs.images["scene"][:1], 2, axis=0)},
        state=np.repeat(obs.state[:1], 2, axis=0),
        instruction=["touch the red cube", "touch the blue cube"],
    )
    chunk = policy.predict_chunk(same_scene)
    assert not np.allclose(chunk[0], chunk[1])


def test_lora_trains_only_adapters_and_heads() -> None:
    default, _ = new_policy(PolicyConfig(), ["scene"], 64, "rp5", 6, 6)
    default.add_lora(LoraSettings())
    trainable, total = default.parameter_counts()
    assert 0 < trainable <= 0.10 * total, "the default VLA trains <= 10% under LoRA"
    policy = tiny()
    policy.add_lora(LoraSettings(rank=4))
    out = policy(**policy.model_inputs(observations()))
    (out.mean.pow(2).mean() + out.target_xy.pow(2).mean() + out.log_std.sum()).backward()
    for name, param in policy.named_parameters():
        is_adapter_or_head = "lora_" in name or name.split(".")[0] in policy.head_names
        assert param.requires_grad == is_adapter_or_head, name
        if is_adapter_or_head and "lora_A" not in name:  # lora_A gets zero grad while B == 0
            assert param.grad is not None, name
        if not is_adapter_or_head:
            assert param.grad is None, name
    names = [n for n, _ in policy.named_parameters() if "lora_A" in n]
    assert any("attention.self.query" in n for n in names)
    assert any("intermediate.dense" in n for n in names), "MLP projections are adapted too"


def test_identity_normaliser_changes_nothing() -> None:
    assert Normalizer.identity(2, 3) == Normalizer([0.0, 0.0], [1.0, 1.0], [0.0] * 3, [1.0] * 3)


def test_normalisation_round_trip_and_floor() -> None:
    policy = tiny(norm=Normalizer([0.0] * 6, [1.0] * 6, [0.1] * 6, [0.5] * 6))
    actions = torch.randn(4, 3, 6)
    torch.testing.assert_close(
        policy.denormalize_actions(policy.normalize_actions(actions)), actions
    )
    stats = {
        "observation.state": {"mean": [0.0] * 6, "std": [0.5] * 6},
        "action": {"mean": [0.0] * 5 + [0.02], "std": [0.05] * 5 + [1.9e-6]},
        "observation.environment_state": {"mean": [0.4, 0.0, 0.02], "std": [0.06, 0.1, 0.0]},
    }
    norm = Normalizer.from_stats(stats)
    assert norm.action_std[-1] == 1e-3 and norm.action_std[0] == 0.05
    assert norm.target_mean == [0.4, 0.0] and norm.target_std == [0.06, 0.1]


def test_a_zero_std_is_floored_and_statistics_stay_out_of_the_weights() -> None:
    """A normaliser given directly (an old policy.json) with a zero std cannot divide by zero;
    the statistics live in policy.json, never in the saved tensors."""
    policy = tiny(norm=Normalizer([0.5] * 6, [0.0] * 6, [0.1] * 6, [0.0] * 6))
    assert policy.state_std.min().item() == pytest.approx(1e-6)
    assert policy.action_std.min().item() == pytest.approx(1e-6)
    assert policy.state_mean.tolist() == pytest.approx([0.5] * 6), "means are not floored"
    normalised = policy.normalize_actions(torch.zeros(1, 3, 6))
    assert torch.isfinite(normalised).all()
    names = set(policy.state_dict())
    assert not {"state_mean", "state_std", "action_mean", "action_std"} & names


def test_full_and_lora_checkpoints_round_trip(tmp_path: Path) -> None:
    obs = observations()
    base = tiny()
    base_hash = save_policy(base, tmp_path / "base", None)
    again = load_policy(tmp_path / "base")
    torch.testing.assert_close(again.predict_chunk(obs), base.predict_chunk(obs), rtol=0, atol=0)

    base.add_lora(LoraSettings(rank=4))
    with torch.no_grad():  # make the adapters non-trivial
        for name, param in base.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    save_policy(base, tmp_path / "lora", BaseRef("checkpoint", str(tmp_path / "base"), base_hash))
    stored = load_file(str(tmp_path / "lora" / "model.safetensors"))
    assert set(stored) == set(base.trainable_state()), "only what trains is stored"
    loaded = load_policy(tmp_path / "lora")
    np.testing.assert_array_equal(loaded.predict_chunk(obs), base.predict_chunk(obs))
    assert not list((tmp_path / "lora").rglob("*.pt")) and not list(
        (tmp_path / "lora").rglob("*.pkl")
    )


@pytest.fixture()
def lora_checkpoint(tmp_path: Path) -> Path:
    base = tiny()
    base_hash = save_policy(base, tmp_path / "base", None)
    base.add_lora(LoraSettings(rank=4))
    save_policy(base, tmp_path / "lora", BaseRef("checkpoint", str(tmp_path / "base"), base_hash))
    return tmp_path / "lora"


def _rewrite_weights(path: Path, edit: str) -> str:
    """Damage the stored tensors one way; return the name of the damaged tensor."""
    weights = path / "model.safetensors"
    tensors = load_file(str(weights))
    name = sorted(n for n in tensors if "lora_A" in n)[0]
    if edit == "missing":
        del tensors[name]
    elif edit == "unexpected":
        name = "extra.weight"
        tensors[name] = torch.zeros(2)
    elif edit == "misshaped":
        tensors[name] = torch.zeros(1, 1)
    save_file(tensors, str(weights))
    rewrite_checksums(path)  # the tensor checks stay behind the checksums
    return name


def rewrite_checksums(path: Path) -> None:
    """Record the checkpoint's files as they are now (what a writer with a bug would leave)."""
    write_checksums(path, file_sums(path, policy_files(path)))


def flip_byte(path: Path) -> None:
    """Change one byte in the middle of ``path``; its size stays."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("missing", "missing tensors: {name}"),
        ("unexpected", "unexpected tensors: {name}"),
        ("misshaped", "mis-shaped tensors: {name} [1, 1] (model [4, "),
    ],
)
def test_mismatched_tensors_are_named(lora_checkpoint: Path, edit: str, message: str) -> None:
    name = _rewrite_weights(lora_checkpoint, edit)
    with pytest.raises(CheckpointError) as err:
        load_policy(lora_checkpoint)
    assert message.format(name=name) in str(err.value)


def test_corrupt_files_and_a_changed_base_are_refused(lora_checkpoint: Path) -> None:
    weights = lora_checkpoint / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(IntegrityError, match=r"model\.safetensors: size check failed"):
        load_policy(lora_checkpoint)
    rewrite_checksums(lora_checkpoint)
    with pytest.raises(CheckpointError, match="unreadable safetensors"):
        load_policy(lora_checkpoint)
    weights.write_bytes(good)
    rewrite_checksums(lora_checkpoint)

    base = lora_checkpoint.parent / "base"
    tensors = load_file(str(base / "model.safetensors"))
    tensors["action_head.bias"] += 1.0
    save_file(tensors, str(base / "model.safetensors"))
    with pytest.raises(IntegrityError, match=r"base/model\.safetensors: sha256 check failed"):
        load_policy(lora_checkpoint)
    rewrite_checksums(base)  # a consistent, but different, base
    with pytest.raises(CheckpointError, match="refusing a different base"):
        load_policy(lora_checkpoint)

    (lora_checkpoint / "policy.json").write_text("{not json")
    with pytest.raises(IntegrityError, match=r"policy\.json: size check failed"):
        load_policy(lora_checkpoint)
    rewrite_checksums(lora_checkpoint)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_policy(lora_checkpoint)
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load_policy(lora_checkpoint.parent)


def test_a_flipped_byte_in_the_weights_or_an_added_file_is_refused(
    lora_checkpoint: Path,
) -> None:
    weights = lora_checkpoint / "model.safetensors"
    flip_byte(weights)
    with pytest.raises(IntegrityError, match=r"model\.safetensors: sha256 check failed") as err:
        load_policy(lora_checkpoint)
    assert (err.value.path, err.value.check) == (weights, "sha256")
    assert "re-create it" in str(err.value)
    flip_byte(weights)  # back as it was
    (lora_checkpoint / "tokenizer" / "extra.json").write_text("{}")
    with pytest.raises(IntegrityError, match=r"extra\.json: unlisted check failed"):
        load_policy(lora_checkpoint)
    (lora_checkpoint / "tokenizer" / "extra.json").unlink()
    (lora_checkpoint / "checksums.json").unlink()
    with pytest.raises(IntegrityError, match=r"checksums\.json: checksums check failed: no"):
        load_policy(lora_checkpoint)


def test_loading_a_lora_checkpoint_hashes_each_file_once(
    lora_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = lora_checkpoint.parent / "base"
    assert checkpoint_hash(base, verify_checkpoint(base)) == checkpoint_hash(base)
    hashed: Counter[str] = Counter()
    real = robo_pipe.integrity.file_sha256

    def counting(path: Any) -> str:
        hashed[str(path)] += 1
        return real(path)

    monkeypatch.setattr(robo_pipe.integrity, "file_sha256", counting)
    load_policy(lora_checkpoint)
    expected = {str(p) for root in (lora_checkpoint, base) for p in policy_files(root)}
    assert set(hashed) == expected and set(hashed.values()) == {1}


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(
    lora_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = checkpoint_hash(lora_checkpoint, verify_checkpoint(lora_checkpoint))
    policy = load_policy(lora_checkpoint)
    meta = json.loads((lora_checkpoint / "policy.json").read_text())

    def full(tensors: dict[str, torch.Tensor], filename: str) -> None:
        Path(filename).write_bytes(b"\0" * 100)  # the part that fitted
        # What safetensors (Rust) raises: no errno, only the OS error in its message.
        raise RuntimeError("Error while serializing: I/O error: No space left (os error 28)")

    monkeypatch.setattr(checkpoint, "save_file", full)
    with pytest.raises(OutOfSpaceError, match=r"lora: the disk is full.*re-run") as err:
        save_policy(policy, lora_checkpoint, BaseRef(**meta["base"]))
    assert err.value.errno == errno.ENOSPC
    assert checkpoint_hash(lora_checkpoint, verify_checkpoint(lora_checkpoint)) == before
    assert sorted(p.name for p in lora_checkpoint.parent.iterdir()) == ["base", "lora"]


def test_step_checkpoints_survive_a_full_disk_and_their_training_state_is_verified(
    lora_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = load_policy(lora_checkpoint)
    meta = json.loads((lora_checkpoint / "policy.json").read_text())
    base, out = BaseRef(**meta["base"]), lora_checkpoint.parent / "run"
    out.mkdir()
    first = commit_checkpoint(out, 1, policy, base, {}, {"m": torch.ones(3)}, "opt.safetensors", {})
    real = checkpoint.save_policy

    def full(*args: Any, **kwargs: Any) -> str:
        real(*args, **kwargs)
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(checkpoint, "save_policy", full)
    with pytest.raises(OutOfSpaceError, match=r"step-0000002: the disk is full"):
        commit_checkpoint(out, 2, policy, base, {}, {"m": torch.ones(3)}, "opt.safetensors", {})
    assert sorted(p.name for p in out.iterdir()) == ["step-0000001"]
    assert latest_checkpoint(out) == first
    tensors, state = restore_training_state(first, "opt.safetensors")
    assert state == {"step": 1} and torch.equal(tensors["m"], torch.ones(3))
    flip_byte(first / "training" / "opt.safetensors")
    with pytest.raises(IntegrityError, match=r"opt\.safetensors: sha256 check failed"):
        restore_training_state(first, "opt.safetensors")
    (first / "checksums.json").unlink()  # as a robo-pipe before checksums wrote it
    assert latest_checkpoint(out) is None, "training starts again rather than fail on it"


def test_saving_over_a_checkpoint_is_atomic(lora_checkpoint: Path) -> None:
    before = checkpoint_hash(lora_checkpoint)
    policy = load_policy(lora_checkpoint)
    meta = json.loads((lora_checkpoint / "policy.json").read_text())
    base = BaseRef(**meta["base"])
    assert save_policy(policy, lora_checkpoint, base) == before
    assert sorted(p.name for p in lora_checkpoint.parent.iterdir()) == ["base", "lora"]


def test_onnx_wrapper_merges_lora_and_matches_the_policy() -> None:
    policy = tiny()
    policy.add_lora(LoraSettings(rank=4))
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    wrapper = as_onnx(policy)
    assert wrapper.input_names == ["image_scene", "state", "tokens", "token_mask"]
    assert wrapper.output_names == ["actions", "action_std"]
    inputs = wrapper.dummy_inputs(batch=2)
    actions, std = wrapper(*inputs)
    assert actions.shape == std.shape == (2, 3, 6)
    obs = BatchedObservation(
        images={"scene": inputs[0].numpy()},
        state=inputs[1].numpy(),
        instruction=["touch the red cube"] * 2,
    )
    np.testing.assert_allclose(actions.detach().numpy(), policy.predict_chunk(obs), atol=1e-5)


def test_hub_vlm_loads_a_local_backbone_with_lora(tmp_path: Path) -> None:
    backbone = save_tiny_idefics3(tmp_path / "tiny-smolvlm")
    config = PolicyConfig(type="hub-vlm", backbone=str(backbone), chunk_len=3)
    torch.manual_seed(0)
    policy, base = new_policy(config, ["scene"], SIZE, "rp5", 6, 6)
    assert base is not None and base.kind == "hub"
    obs = observations()
    assert policy.distribution(obs).mean.shape == (3, 3, 6)
    policy.add_lora(LoraSettings(rank=4))
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert any("text_model" in n and "q_proj.lora_A" in n for n in trainable)
    assert not any(n.startswith("backbone.") and "lora_" not in n for n in trainable)
    save_policy(policy, tmp_path / "ckpt", base)
    loaded = load_policy(tmp_path / "ckpt")
    np.testing.assert_allclose(loaded.predict_chunk(obs), policy.predict_chunk(obs), atol=1e-6)

    shutil.copy(backbone / "config.json", tmp_path / "config.json")
    config_json = json.loads((backbone / "config.json").read_text())
    config_json["scale_factor"] = 2  # same value, different bytes: still a different file
    (backbone / "config.json").write_text(json.dumps(config_json, indent=4))
    with pytest.raises(CheckpointError, match="refusing a different base"):
        load_policy(tmp_path / "ckpt")


def test_a_backbone_is_hashed_once_per_process_until_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from stages.policy import hub_vla

    backbone = save_tiny_idefics3(tmp_path / "tiny-smolvlm")
    digests: list[object] = []
    real = hashlib.sha256

    def counted() -> object:
        digests.append(real())
        return digests[-1]

    monkeypatch.setattr(hub_vla.hashlib, "sha256", counted)
    first = hub_vla.backbone_hash(backbone)
    assert hub_vla.backbone_hash(backbone) == first and len(digests) == 1
    config = backbone / "config.json"
    config.write_text(config.read_text() + " ")  # same content, one more byte
    assert hub_vla.backbone_hash(backbone) != first and len(digests) == 2


def test_a_save_killed_at_any_moment_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    """A child saves two different policies in turn to one path, over and over; SIGKILLed after
    a random delay (seeded), 25 times, then before each file operation of one save, the path
    always loads, verified, as one of the two."""
    first, second = tiny(), tiny()
    with torch.no_grad():
        next(second.parameters()).add_(1.0)
    path = tmp_path / "ckpt"
    hashes = {save_policy(policy, path, None) for policy in (first, second)}
    assert len(hashes) == 2
    interrupted: list[bool] = []  # per kill: whether a save was under way (left a temporary)

    def check(step: int) -> None:
        loaded = load_policy(path)  # verified against its checksums, or it raises
        assert checkpoint_hash(path) in hashes, f"step {step}"
        assert any(
            all(torch.equal(a, b) for a, b in zip(loaded.parameters(), p.parameters(), strict=True))
            for p in (first, second)
        )
        interrupted.append(bool(discard_dead_temporaries(tmp_path)))  # the killed child's
        assert os.listdir(tmp_path) == ["ckpt"], f"step {step}: {os.listdir(tmp_path)}"

    def save_forever() -> None:
        for turn in itertools.count():
            save_policy((first, second)[turn % 2], path, None)

    rng = random.Random(25)
    for kill in range(25):
        pid = os.fork()
        if pid == 0:
            try:
                save_forever()
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.1))  # a few saves' worth: any point of one
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        check(kill)
    assert sum(interrupted) >= 10, f"only {sum(interrupted)} of 25 kills hit a save under way"
    assert kill_at_every_step(lambda: save_policy(second, path, None), check) >= 10


class _DotWords(TouchTasks):
    """A task family whose instructions share no word with touch's but "the"."""

    name = "dot-words"

    def instructions(self) -> list[str]:
        return ["reach the dot", "go to the dot"]


DOT_WORDS = _DotWords()


def test_a_new_policy_learns_its_task_familys_words_and_records_its_robot_and_task(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default policy's own tokenizer is trained on the family's instructions (no touch
    word in it), and the checkpoint names the robot and the family, which loading keeps."""
    monkeypatch.setitem(tasks.TASKS, "dot-words", "tests.stages.test_policy:DOT_WORDS")
    policy, _ = new_policy(TINY_POLICY, ["scene"], SIZE, "hand", 6, 4, task="dot-words")
    touch, _ = new_policy(TINY_POLICY, ["scene"], SIZE, "rp5", 6, 6)
    assert isinstance(policy.tokenizer, InstructionTokenizer)
    assert isinstance(touch.tokenizer, InstructionTokenizer)
    vocab = set(policy.tokenizer.tokenizer.get_vocab())
    assert {"reach", "go", "to", "dot"} <= vocab and not vocab & {"touch", "cube", "red"}
    assert {"touch", "cube", "red"} <= set(touch.tokenizer.tokenizer.get_vocab())
    save_policy(policy, tmp_path / "dots", None)
    loaded = load_policy(tmp_path / "dots").cfg
    assert (loaded.robot, loaded.task, loaded.action_dim) == ("hand", "dot-words", 4)
    # A checkpoint saved before robots and tasks were recorded was made for rp5 and touch.
    meta = json.loads((tmp_path / "dots" / "policy.json").read_text())
    del meta["config"]["robot"], meta["config"]["task"]
    assert VLAConfig.from_dict(meta["config"]).robot == "rp5"
    assert VLAConfig.from_dict(meta["config"]).task == "touch"
