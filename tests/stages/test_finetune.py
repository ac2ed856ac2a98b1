"""Behaviour cloning: chunk targets, stats merging, a tiny run that learns, resume after a kill,
Ray Train with DDP, pretrain + LoRA finetune records."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from pipelines.config import load_config
from stages.dataset.layout import DatasetRef
from stages.finetune import FinetuneConfig, PretrainConfig, finetune, pretrain
from stages.finetune.bc import BCJob, bc_loss, build_policy, train_bc
from stages.finetune.checkpoints import latest_checkpoint, read_metrics
from stages.finetune.config import BCConfig
from stages.finetune.data import chunk_targets, load_bc_data, merge_stats
from stages.policy.checkpoint import (
    LEGACY_UNUSED_TENSORS,
    CheckpointError,
    CheckpointRef,
    checkpoint_hash,
    load_policy,
    load_trainable,
    new_policy,
)
from stages.policy.config import PolicyConfig
from stages.policy.types import BaseRef
from tests.conftest import TINY_CONFIG
from tests.stages.tiny_models import TINY_POLICY, save_tiny_idefics3, tiny_base

ROOT = Path(__file__).resolve().parents[2]


def tiny_job(out: Path, dataset: DatasetRef, steps: int = 40, **bc: object) -> BCJob:
    return BCJob(
        out=str(out),
        datasets=[dataset.path],
        bc=BCConfig.model_validate(
            {
                "steps": steps,
                "batch_size": 16,
                "warmup_steps": 5,
                "checkpoint_every": 10,
                "log_every": 5,
                **bc,
            }
        ),
        seed=3,
        trainable="all",
        policy=TINY_POLICY,
        cameras=["scene"],
        image_size=32,
        robot="rp5",
        task="touch",
        state_dim=6,
        action_dim=6,
        threads=1,
    )


def test_chunk_targets_stop_at_episode_ends() -> None:
    actions = np.arange(5, dtype=np.float32)[:, None]
    episode = np.array([0, 0, 0, 1, 1])
    chunks, valid = chunk_targets(actions, episode, 3)
    assert chunks[:, :, 0].tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]
    assert valid.tolist() == [
        [True, True, True],
        [True, True, False],
        [True, False, False],
        [True, True, False],
        [True, False, False],
    ]


def test_chunk_targets_past_the_end_hold_still_when_asked() -> None:
    """``finetune.bc.after_end: hold``: past the episode's end the step components are 0, the
    others the last action, and every position trains."""
    actions = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]], dtype=np.float32)
    episode = np.array([0, 0, 1, 1])
    chunks, valid = chunk_targets(actions, episode, 3, hold=np.array([True, False]))
    assert valid.all()
    assert chunks[1].tolist() == [[2, 20], [0, 20], [0, 20]]  # the episode's last, then still
    assert chunks[2].tolist() == [[3, 30], [4, 40], [0, 40]]


def test_merged_stats_equal_the_stats_of_the_concatenation() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(1, 2, (100, 3)), rng.normal(-1, 0.5, (300, 3))

    def stats(x: np.ndarray) -> dict[str, object]:
        return {"action": {"mean": x.mean(0).tolist(), "std": x.std(0).tolist(), "count": [len(x)]}}

    merged = merge_stats([stats(a), stats(b)], ("action",))["action"]
    both = np.concatenate([a, b])
    np.testing.assert_allclose(merged["mean"], both.mean(0), atol=1e-12)
    np.testing.assert_allclose(merged["std"], both.std(0), atol=1e-12)


def test_bc_data_has_chunks_targets_and_instructions(tiny_dataset: DatasetRef) -> None:
    data = load_bc_data([tiny_dataset.path, tiny_dataset.path], ("scene",), 3)
    assert len(data) == 2 * tiny_dataset.frames
    assert data.images["scene"].shape[1:] == (32, 32, 3)
    assert data.actions.shape == (len(data), 3, 6) and data.target_xy is not None
    assert len(data.instructions) <= tiny_dataset.episodes, "shared tasks are merged"
    assert data.hashes == [tiny_dataset.content_hash] * 2
    batch = data.batch(np.arange(8), np.random.default_rng(0), shift=2)
    assert batch["images"]["scene"].shape == (8, 32, 32, 3)


def test_a_tiny_bc_run_reduces_its_loss(tiny_dataset: DatasetRef, tmp_path: Path) -> None:
    job = tiny_job(tmp_path, tiny_dataset, steps=60)
    train_bc(job)
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == list(range(5, 61, 5))
    # Loss over the whole dataset: the initial model (same seed) against the trained one.
    data = load_bc_data(job.datasets, ("scene",), TINY_POLICY.chunk_len)
    everything = data.batch(np.arange(len(data)), np.random.default_rng(0), shift=0)
    torch.manual_seed(job.seed)
    initial, _ = build_policy(job, data)
    trained = load_policy(tmp_path / "step-0000060")
    losses = []
    for policy in (initial, trained):
        tokens, mask = (torch.as_tensor(a) for a in policy.tokenizer(data.instructions))
        with torch.no_grad():
            losses.append(bc_loss(policy, policy, everything, tokens, mask, 1.0))
    assert losses[1][1] < 0.85 * losses[0][1], "action loss falls"
    assert losses[1][2] < 0.85 * losses[0][2], "auxiliary target loss falls"
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-0000050", "step-0000060"]


def test_killed_training_resumes_at_the_same_step_and_state(
    tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    reference = tmp_path / "reference"
    train_bc(tiny_job(reference, tiny_dataset, steps=60, batch_size=64))

    resumed = tmp_path / "resumed"
    job = pickle.dumps(tiny_job(resumed, tiny_dataset, steps=60, batch_size=64)).hex()
    code = (
        "import pickle, sys; from stages.finetune.bc import train_bc; "
        "train_bc(pickle.loads(bytes.fromhex(sys.argv[1])))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, job], cwd=ROOT)
    deadline = time.monotonic() + 120
    while latest_checkpoint(resumed) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = latest_checkpoint(resumed)
    assert killed_at is not None and killed_at.name != "step-0000060", "kill came too late"

    train_bc(tiny_job(resumed, tiny_dataset, steps=60, batch_size=64))
    a = load_file(str(reference / "step-0000060" / "model.safetensors"))
    b = load_file(str(resumed / "step-0000060" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)
    opt_a = load_file(str(reference / "step-0000060" / "training" / "optimizer.safetensors"))
    opt_b = load_file(str(resumed / "step-0000060" / "training" / "optimizer.safetensors"))
    for name in opt_a:
        np.testing.assert_array_equal(opt_a[name].numpy(), opt_b[name].numpy(), err_msg=name)


@pytest.mark.parametrize("with_target", [True, False])
@pytest.mark.parametrize("trainable", ["all", "lora"])
@pytest.mark.parametrize("kind", ["default", "hub-vlm"])
def test_every_trainable_parameter_receives_a_gradient(
    kind: str, trainable: str, with_target: bool, tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    """DDP's rule: with two or more workers, a trainable parameter that gets no gradient from
    the BC loss stops training (BERT's word embeddings once did, as parameter 22)."""
    if kind == "default":
        policy = TINY_POLICY
    else:
        policy = PolicyConfig(
            type="hub-vlm", backbone=str(save_tiny_idefics3(tmp_path / "vlm")), chunk_len=3
        )
    job = replace(tiny_job(tmp_path, tiny_dataset), trainable=trainable, policy=policy)
    data = load_bc_data(job.datasets, tuple(job.cameras), policy.chunk_len)
    if not with_target:  # a dataset without observation.environment_state
        data = replace(data, target_xy=None)
    model, _ = build_policy(job, data)
    tokens, mask = (torch.as_tensor(a) for a in model.tokenizer(data.instructions))
    batch = data.batch(np.arange(8), np.random.default_rng(0), 0)
    aux_weight = 0.5 if with_target else 0.0  # as train_bc sets it
    loss, _, _ = bc_loss(model, model, batch, tokens, mask, aux_weight)
    loss.backward()
    trainable_params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable_params
    assert not [n for n, p in trainable_params.items() if p.grad is None]


def test_a_checkpoint_saved_with_the_unused_word_embeddings_still_loads(tmp_path: Path) -> None:
    """Bases pretrained before the default VLA dropped BERT's word-embedding table hold it:
    loading drops exactly that tensor and stays strict about any other."""
    from safetensors.torch import save_file

    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    old = {name: t.clone() + 1.0 for name, t in policy.trainable_state().items()}
    old[LEGACY_UNUSED_TENSORS[0]] = torch.zeros(1, TINY_POLICY.d_model)
    save_file(old, str(tmp_path / "old.safetensors"))
    save_file({**old, "stray": torch.zeros(1)}, str(tmp_path / "stray.safetensors"))
    load_trainable(policy, tmp_path / "old.safetensors")
    state = policy.trainable_state()
    assert all(torch.equal(state[n], old[n]) for n in state)
    with pytest.raises(CheckpointError, match="unexpected tensors: stray"):
        load_trainable(policy, tmp_path / "stray.safetensors")


def test_pretrain_then_lora_and_full_finetune_on_ray_train_with_two_workers(
    tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    """Two DDP workers for both trainable sets: pretraining trains every parameter, LoRA the
    adapters and heads. Pretraining counts its demonstrations (shard by shard, all of them
    before its first step: the demo's 3,000 take minutes), then its steps. The full fine-tune
    of the base then trains every parameter in this process (DDP over every parameter is
    pretraining's; a third Ray Train start cost 30-60 s of CI)."""
    cfg = load_config(TINY_CONFIG)
    bc = BCConfig(steps=20, batch_size=16, warmup_steps=2, checkpoint_every=10, log_every=5)
    seen: list[float] = []
    events: list[str] = []

    def on_metrics(metrics: dict[str, float]) -> None:
        seen.append(metrics["step"])
        events.append(f"step {metrics['step']:.0f}")

    def run_pretrain() -> CheckpointRef:
        return pretrain(
            cfg.robot,
            cfg.scene,
            cfg.sim,
            cfg.collect,
            TINY_POLICY,
            PretrainConfig(episodes_per_variant=4, bc=bc.model_copy(update={"workers": 2})),
            seed=0,
            checkpoints_dir=tmp_path / "checkpoints",
            datasets_dir=tmp_path / "datasets",
            on_metrics=on_metrics,
            on_collected=lambda done, total: events.append(f"{done} of {total}"),
        )

    base = run_pretrain()
    assert base.trainable == "all" and base.step == 20 and seen[-1] == 20
    assert len(base.dataset_hashes) == 3, "one dataset per pretraining variant"
    # tiny.yaml: 4 episodes a shard, so one shard per variant; then the count is complete.
    assert events[:5] == ["4 of 12", "8 of 12", "12 of 12", "12 of 12", "step 5"], events
    lineage = json.loads((Path(base.path) / "policy.json").read_text())["lineage"]
    assert "touch-mixed" not in lineage["variants"]
    assert "touch-single" not in lineage["variants"], "touch-single is not pretrained on"
    assert lineage["config"]["pretrain"]["episodes_per_variant"] == 4 and base.config_hash
    trained_steps = list(seen)
    again = run_pretrain()
    assert seen == trained_steps, "no training the second time"
    assert again == base, "the base is cached"

    ref = finetune(
        tiny_dataset,
        TINY_POLICY,
        FinetuneConfig(bc=bc.model_copy(update={"workers": 2})),
        base,
        seed=0,
        checkpoints_dir=tmp_path / "checkpoints",
        name="tiny",
    )
    assert ref.trainable == "lora" and ref.step == 20
    assert ref.trainable_params < ref.total_params / 2
    assert ref.base == BaseRef("checkpoint", base.path, base.content_hash)
    assert ref.dataset_hashes == [tiny_dataset.content_hash]
    assert ref.metrics["samples_per_s"] > 0 and checkpoint_hash(ref.path) == ref.content_hash
    policy = load_policy(ref.path)
    assert policy.lora is not None
    assert policy.parameter_counts() == (ref.trainable_params, ref.total_params)
    assert len(ref.worker_nodes) == 2 and all(ref.worker_nodes), "each rank's Ray node"

    full = finetune(
        tiny_dataset,
        TINY_POLICY,
        FinetuneConfig(trainable="all", bc=bc.model_copy(update={"workers": 0, "steps": 10})),
        base,
        seed=0,
        checkpoints_dir=tmp_path / "checkpoints",
        name="tiny-full",
    )
    assert full.trainable == "all" and full.step == 10
    assert full.trainable_params == full.total_params
    moved = load_file(str(Path(full.path) / "model.safetensors"))
    start = load_file(str(Path(base.path) / "model.safetensors"))
    assert all(not torch.equal(moved[n], start[n]) for n in start), "every parameter trained"


def test_hub_vlm_finetunes_lora_on_its_backbone(tiny_dataset: DatasetRef, tmp_path: Path) -> None:
    backbone = save_tiny_idefics3(tmp_path / "tiny-smolvlm")
    policy = PolicyConfig(type="hub-vlm", backbone=str(backbone), chunk_len=3)
    bc = BCConfig(steps=6, batch_size=8, warmup_steps=1, checkpoint_every=3, workers=0)
    ref = finetune(
        tiny_dataset, policy, FinetuneConfig(bc=bc), None, 0, tmp_path / "checkpoints", "hub"
    )
    assert ref.policy_type == "hub-vlm" and ref.trainable == "lora"
    assert ref.base is not None and ref.base.kind == "hub"
    loaded = load_policy(ref.path)
    assert loaded.parameter_counts() == (ref.trainable_params, ref.total_params)


def test_a_dataset_that_does_not_fit_the_base_is_refused(
    tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    base = tiny_base(tmp_path / "base48", image_size=48)
    with pytest.raises(ValueError, match=r"does not fit the base .*base48"):
        finetune(tiny_dataset, TINY_POLICY, FinetuneConfig(), base, 0, tmp_path / "ckpt")
    # The same sizes, made for another robot: refused by the robot's name.
    other = tiny_base(tmp_path / "hand", robot="hand")
    with pytest.raises(ValueError, match=r"robot 'rp5' cannot fine-tune .* made for robot 'hand'"):
        finetune(tiny_dataset, TINY_POLICY, FinetuneConfig(), other, 0, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists(), "refused before any work"


# Another process fine-tuning the same inputs (a teammate's run of the same config).
TEAMMATE = """
import json, sys
from pathlib import Path
from robo_pipe.locks import set_run_label
from stages.finetune import FinetuneConfig, finetune
from stages.policy.checkpoint import CheckpointRef
from tests.stages.tiny_models import TINY_POLICY

dataset, base, checkpoints, config = sys.argv[1:5]
set_run_label("teammate")
base_ref = CheckpointRef.from_json(json.loads(base))
config_ = FinetuneConfig.model_validate_json(config)
ref = finetune(dataset, TINY_POLICY, config_, base_ref, 0, Path(checkpoints), "tiny")
print(json.dumps(ref.to_json()))
"""


def test_a_second_finetune_of_the_same_inputs_waits_and_reuses_the_first(
    tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    base = tiny_base(tmp_path / "base")
    bc = BCConfig(steps=20, batch_size=16, warmup_steps=2, checkpoint_every=10, workers=0)
    config = FinetuneConfig(bc=bc)
    checkpoints = tmp_path / "checkpoints"
    args = [tiny_dataset.path, json.dumps(base.to_json()), str(checkpoints)]
    teammate = subprocess.Popen(
        [sys.executable, "-c", TEAMMATE, *args, config.model_dump_json()],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(checkpoints.glob(".tiny-finetune-*.owner.json")):  # it holds the lock
        assert teammate.poll() is None and time.monotonic() < deadline, "it never trained"
        time.sleep(0.01)

    lines: list[str] = []
    seen: list[dict[str, float]] = []
    ref = finetune(
        tiny_dataset,
        TINY_POLICY,
        config,
        base,
        0,
        checkpoints,
        "tiny",
        on_metrics=seen.append,
        on_status=lines.append,
    )
    out, _ = teammate.communicate(timeout=120)
    assert teammate.returncode == 0
    first = CheckpointRef.from_json(json.loads(out.strip().splitlines()[-1]))
    assert ref == first and seen == [], "the teammate's record, with no training here"
    assert lines == [
        f"waiting for run teammate (pid {teammate.pid}) to finish finetune of "
        f"{Path(first.path).parent}",
        f"reusing the finished checkpoint {first.path}",
    ]


def test_random_weight_hub_vlm_finetunes_lora(tiny_dataset: DatasetRef, tmp_path: Path) -> None:
    from tests.stages.tiny_models import TINY_VLM_POLICY

    bc = BCConfig(steps=6, batch_size=8, warmup_steps=1, checkpoint_every=3, workers=0)
    ref = finetune(
        tiny_dataset, TINY_VLM_POLICY, FinetuneConfig(bc=bc), None, 0, tmp_path / "ck", "rnd"
    )
    assert ref.base is not None and ref.base.kind == "random" and ref.trainable == "lora"
    loaded = load_policy(ref.path)
    assert loaded.cfg.random_weights
    assert loaded.parameter_counts() == (ref.trainable_params, ref.total_params)
