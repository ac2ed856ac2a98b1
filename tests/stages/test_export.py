"""The export stage: parity on random and real dataset inputs, the I/O spec, refusal; its
checksums, verified wherever an export is opened; reuse; a disk that fills up."""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from deploy_edge.bundle.files import copy_bundle, verify_bundle
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.exported import ExportedPolicy
from robo_pipe.atomic import discard_dead_temporaries
from robo_pipe.errors import OutOfSpaceError
from robo_pipe.integrity import IntegrityError
from robots.rp5 import RP5
from robots.spec import get_robot
from stages.dataset.layout import DatasetRef
from stages.export import ExportError, ExportRef, export, onnx_hash
from stages.export import onnx as export_module
from stages.policy.base import Normalizer
from stages.policy.checkpoint import new_policy, save_policy
from tests.stages.tiny_models import TINY_POLICY


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    save_policy(policy, tmp_path / "ckpt", None)
    return tmp_path / "ckpt"


def test_export_parity_spec_and_files(
    checkpoint: Path, tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    ref = export(checkpoint, tmp_path / "export", RP5.control_hz, dataset=tiny_dataset.path)
    assert set(ref.parity) == {"random", "dataset"}
    assert max(ref.parity.values()) < 1e-4 and ref.parity_max_abs_error == max(ref.parity.values())
    model = onnx.load(ref.onnx)
    onnx.checker.check_model(model)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 18
    batch_dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param, "the batch axis is dynamic"
    spec = read_io_spec(tmp_path / "export")
    assert [i.name for i in spec.inputs] == ["image_scene", "state", "tokens", "token_mask"]
    assert spec.chunk_len == 3 and spec.control_hz == 10.0
    assert all(t.units and t.shape[0] == "batch" for t in spec.inputs + spec.outputs)
    rp5 = get_robot("rp5")
    assert spec.inputs[1].units == rp5.state_units_text, "the robot's units, not a literal"
    assert spec.outputs[0].units == rp5.action_units_text
    assert spec.inputs[0].shape == ("batch", 32, 32, 3) and spec.outputs[0].dims() == (-1, 3, 6)
    assert spec.parity == ref.parity and spec.checkpoint_hash == ref.checkpoint_hash
    assert (spec.format, spec.format_version, spec.onnx_file) == (
        "robo-pipe-onnx",
        4,  # 4: a delay-conditioned policy's prefix inputs (none here)
        "policy.onnx",
    )
    assert spec.prefix_ticks == 0 and "prefix" not in spec.input_names
    assert spec.robot == "rp5", "the robot the checkpoint was made for"
    assert ExportRef.from_json(ref.to_json()) == ref
    reference = np.load(tmp_path / "export" / "reference.npz")
    assert reference["expected_actions"].shape == (8, 3, 6)
    assert (tmp_path / "export" / "tokenizer" / "tokenizer.json").is_file()


def test_an_export_outside_tolerance_is_refused_and_replaces_nothing(
    checkpoint: Path, tmp_path: Path
) -> None:
    good = export(checkpoint, tmp_path / "export", RP5.control_hz)
    with pytest.raises(ExportError, match="differs from torch"):
        export(
            checkpoint,
            tmp_path / "export",
            RP5.control_hz,
            tolerance=0.0 if good.parity_max_abs_error else -1.0,
        )
    assert (tmp_path / "export" / "policy.onnx").is_file(), "the good export is untouched"


def test_the_graph_normalises_state_and_denormalises_actions_with_real_statistics(
    tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    """ONNX Runtime's outputs equal the model's raw head output on a state normalised by hand
    with the dataset's statistics, then de-normalised by hand into robot units."""
    import onnxruntime as ort

    from stages.dataset.layout import STATE_KEY
    from stages.dataset.reader import open_dataset

    dataset = open_dataset(tiny_dataset.path)
    norm = Normalizer.from_stats(dataset.stats)
    state_mean, state_std = np.array(norm.state_mean), np.array(norm.state_std)
    action_mean, action_std = np.array(norm.action_mean), np.array(norm.action_std)
    # Statistics that make a forgotten step visible: means far from 0, scales far from 1.
    assert np.abs(state_mean).max() > 0.3 and np.abs(state_std - 1).min() > 0.3
    assert np.abs(action_mean).max() > 1e-3 and np.abs(action_std - 1).min() > 0.5
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6, normalizer=norm)
    with torch.no_grad():
        policy.log_std.copy_(torch.linspace(-1.0, 0.5, 6))
        policy.state_proj.weight.mul_(20.0)  # type: ignore[union-attr,operator]  # the state matters
        policy.action_head.weight.mul_(5.0)
    save_policy(policy, tmp_path / "ckpt", None)
    ref = export(tmp_path / "ckpt", tmp_path / "export", RP5.control_hz, dataset=tiny_dataset.path)

    frames = dataset.frames()
    idx = np.linspace(0, dataset.num_frames - 1, 6).astype(int)
    images = dataset.camera_frames("scene")[idx]
    state = frames[STATE_KEY][idx].astype(np.float32)
    tokens, mask = policy.tokenizer([dataset.tasks[int(t)] for t in frames["task_index"][idx]])
    session = ort.InferenceSession(ref.onnx, providers=["CPUExecutionProvider"])
    feeds = {"image_scene": images, "state": state, "tokens": tokens, "token_mask": mask}
    actions, stds = session.run(["actions", "action_std"], feeds)

    with torch.no_grad():
        features, _ = policy.encode(
            {"scene": torch.as_tensor(images)},
            torch.as_tensor((state - state_mean) / state_std, dtype=torch.float32),
            torch.as_tensor(tokens),
            torch.as_tensor(mask),
        )
        raw = policy.action_head(features).numpy()
    expected = raw * action_std + action_mean
    np.testing.assert_allclose(actions, expected, rtol=0, atol=2e-6)
    expected_std = np.exp(np.linspace(-1.0, 0.5, 6)) * action_std
    np.testing.assert_allclose(stds, np.broadcast_to(expected_std, stds.shape), rtol=1e-5)
    # Dropping either step would move the actions far beyond the tolerance above (the random
    # transformer's layer norms damp the state token, hence the scaled state projection).
    assert np.abs(raw - expected).max() > 1e-2
    with torch.no_grad():
        unnormalised, _ = policy.encode(
            {"scene": torch.as_tensor(images)},
            torch.as_tensor(state),
            torch.as_tensor(tokens),
            torch.as_tensor(mask),
        )
        skipped = policy.action_head(unnormalised).numpy() * action_std + action_mean
    assert np.abs(skipped - expected).max() > 1e-4, "the state's normalisation matters"


def flip_byte(path: Path) -> None:
    """Change one byte in the middle of ``path``; its size stays."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_checkpoint_is_refused_before_anything_is_written(
    checkpoint: Path, tmp_path: Path
) -> None:
    flip_byte(checkpoint / "model.safetensors")
    with pytest.raises(IntegrityError, match=r"model\.safetensors: sha256 check failed") as err:
        export(checkpoint, tmp_path / "export", RP5.control_hz)
    assert err.value.check == "sha256"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "nothing written"


def test_an_export_is_verified_wherever_it_is_opened(checkpoint: Path, tmp_path: Path) -> None:
    ref = export(checkpoint, tmp_path / "export", RP5.control_hz)
    sums = verify_bundle(ref.path)
    assert "checksums.json" not in sums and {"policy.onnx", "io_spec.json"} <= set(sums)
    assert ref.onnx_hash == onnx_hash(Path(ref.path)) == onnx_hash(Path(ref.path), sums)
    registry = tmp_path / "registry"  # a copy under another model name, as the registry's:
    registry.mkdir()  # MLflow writes the model again, its external data inside
    onnx.save(onnx.load(ref.onnx), str(registry / "model.onnx"))
    copy_bundle(ref.path, registry, model_file="model.onnx")
    assert "model.onnx" in verify_bundle(registry)
    for bundle, model in ((Path(ref.path), "policy.onnx"), (registry, "model.onnx")):
        flip_byte(bundle / model)
        with pytest.raises(IntegrityError, match=rf"{model}: sha256 check failed") as err:
            ExportedPolicy(bundle)
        assert (err.value.path, err.value.check) == (bundle / model, "sha256")
        with pytest.raises(IntegrityError, match="sha256 check failed"):
            copy_bundle(bundle, tmp_path / "copy-of-a-bad-one")
    flip_byte(registry / "model.onnx")
    flip_byte(registry / "tokenizer" / "tokenizer.json")
    with pytest.raises(IntegrityError, match=r"tokenizer\.json: sha256 check failed"):
        ExportedPolicy(registry)


def test_an_export_of_the_same_checkpoint_is_reused_and_a_changed_one_replaced(
    checkpoint: Path, tmp_path: Path
) -> None:
    first = export(checkpoint, tmp_path / "export", RP5.control_hz)
    written = (tmp_path / "export" / "policy.onnx").stat().st_mtime_ns
    assert export(checkpoint, tmp_path / "export", RP5.control_hz) == first
    assert (tmp_path / "export" / "policy.onnx").stat().st_mtime_ns == written, "not redone"
    flip_byte(tmp_path / "export" / "reference.npz")  # an export that no longer verifies
    again = export(checkpoint, tmp_path / "export", RP5.control_hz)

    def without_cost(ref: ExportRef) -> ExportRef:  # a redone export has its own cost
        return replace(ref, export_seconds=0.0, export_peak_rss_mb=0.0)

    assert without_cost(again) == without_cost(first) and verify_bundle(again.path)
    torch.manual_seed(1)
    other, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    save_policy(other, checkpoint, None)
    changed = export(checkpoint, tmp_path / "export", RP5.control_hz)
    assert changed.checkpoint_hash != first.checkpoint_hash
    assert changed.onnx_hash != first.onnx_hash


def _fail_after_writing(real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, except that it then fails as a full disk does: part of the file is there."""

    def fail(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    return fail


def test_a_full_disk_while_exporting_leaves_the_previous_export(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = export(checkpoint, tmp_path / "export", RP5.control_hz)
    torch.manual_seed(1)
    other, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    save_policy(other, checkpoint, None)
    monkeypatch.setattr(export_module.np, "savez", _fail_after_writing(np.savez))
    with pytest.raises(OutOfSpaceError, match=r"export: the disk is full.*export is as it was"):
        export(checkpoint, tmp_path / "export", RP5.control_hz)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "export"], "no partial one"
    assert read_io_spec(tmp_path / "export").checkpoint_hash == first.checkpoint_hash
    verify_bundle(tmp_path / "export")
    monkeypatch.undo()  # space freed: the same command exports
    assert (
        export(checkpoint, tmp_path / "export", RP5.control_hz).checkpoint_hash
        != first.checkpoint_hash
    )


def test_an_export_killed_at_random_moments_leaves_a_whole_export(
    checkpoint: Path, tmp_path: Path
) -> None:
    """A child exports the other of two checkpoints over ``out``; SIGKILLed after a random
    delay (seeded) 4 times, ``out`` always verifies as the export of one of them."""
    other = tmp_path / "other"
    torch.manual_seed(1)
    save_policy(new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)[0], other, None)
    out = tmp_path / "export"
    started = time.perf_counter()
    sources = {
        export(source, out, RP5.control_hz).checkpoint_hash: source
        for source in (checkpoint, other)
    }
    seconds = (time.perf_counter() - started) / 2
    interrupted = 0
    rng = random.Random(25)
    for _ in range(4):
        there = read_io_spec(out).checkpoint_hash
        (source,) = (path for digest, path in sources.items() if digest != there)
        pid = os.fork()
        if pid == 0:
            try:
                export(source, out, RP5.control_hz)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.2, 1.0) * seconds)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert read_io_spec(out).checkpoint_hash in sources
        verify_bundle(out)
        interrupted += bool(discard_dead_temporaries(tmp_path))
        assert sorted(os.listdir(tmp_path)) == ["ckpt", "export", "other"]
    assert interrupted >= 2, f"only {interrupted} of 4 kills hit an export under way"
