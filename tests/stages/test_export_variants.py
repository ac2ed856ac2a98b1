"""The export's precision variants: the INT8 Q/DQ graph made from the FP32 one, calibrated on
some of the dataset's episodes and scored on the others, listed in the spec and the checksums;
a variant past the error bar kept but never a candidate; rewriting the figures atomically."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from deploy_edge.bundle.files import verify_bundle
from deploy_edge.bundle.io_spec import read_io_spec
from robo_pipe.integrity import IntegrityError
from robots.rp5 import RP5
from stages.dataset.layout import DatasetRef
from stages.evaluate.policies import OnnxRuntimePolicy, load_acting_policy, variant_of
from stages.export import ExportConfig, ExportRef, export
from stages.export.onnx import update_variants
from stages.export.quantize import INT8_METHOD, UINT8_METHOD
from stages.policy.checkpoint import load_policy, new_policy, save_policy
from tests.stages.tiny_models import TINY_POLICY

SMALL = ExportConfig(calibration_frames=16, score_frames=16)
"""The default variants (int8) on as few frames as the tiny profile uses."""


@pytest.fixture(scope="module")
def int8_export(
    tmp_path_factory: pytest.TempPathFactory, tiny_dataset: DatasetRef
) -> tuple[Path, ExportRef]:
    """A tiny policy exported once with its INT8 variant (checkpoint beside it: ``ckpt``)."""
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    root = tmp_path_factory.mktemp("int8")
    save_policy(policy, root / "ckpt", None)
    return root, export(
        root / "ckpt", root / "export", RP5.control_hz, dataset=tiny_dataset.path, config=SMALL
    )


def test_the_int8_variant_is_written_calibrated_scored_and_checksummed(
    int8_export: tuple[Path, ExportRef], tiny_dataset: DatasetRef
) -> None:
    root, ref = int8_export
    spec = read_io_spec(ref.path)
    (int8,) = spec.variants
    assert ref.variants == spec.variants and spec.variant("int8") == int8
    assert (int8.name, int8.precision, int8.onnx_file) == ("int8", "int8", "policy.int8.onnx")
    assert int8.method == INT8_METHOD
    sums = verify_bundle(ref.path)
    assert "policy.int8.onnx" in sums, "the variant is part of the bundle's checksums"

    # Calibration: recorded, and on other episodes than the held-out ones scored.
    cal = int8.calibration
    assert cal["dataset"] == str(Path(tiny_dataset.path).resolve())
    assert cal["frames"] == 16 and cal["method"] == "static" and cal["calibrate_method"] == "MinMax"
    assert cal["episodes"] + cal["scoring_episodes"] == tiny_dataset.episodes
    assert cal["scoring_episodes"] >= 1 and int8.scored_frames == 16

    # Scored: robot units, relative to each action dimension's std, against torch too.
    assert 0 < int8.action_error <= int8.action_error_max
    std = load_policy(root / "ckpt").action_std.numpy()
    by_dim = np.asarray(cal["relative_error_by_dim"])
    assert int8.relative_error == pytest.approx(by_dim.max(), rel=1e-4)
    assert by_dim.shape == std.shape
    assert 0 < int8.reference_error < 1.0
    assert int8.candidate and int8.reason == "" and int8.success == {}

    # The graph: explicit Q/DQ, symmetric (zero points 0: TensorRT's explicit quantisation),
    # per-channel weights (one scale per output channel), FP32 in and out.
    model = onnx.load(str(Path(ref.path) / int8.onnx_file))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") >= 1 and ops.count("DequantizeLinear") > ops.count(
        "QuantizeLinear"
    ), "weights are stored INT8 and dequantised; activations get Q/DQ pairs"
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    zero_points = [inits[n.input[2]] for n in model.graph.node if n.op_type.endswith("Linear")]
    assert {z.dtype for z in zero_points} <= {np.dtype(np.int8), np.dtype(np.int32)}  # biases
    assert any(z.dtype == np.int8 for z in zero_points) and not any(z.any() for z in zero_points)
    per_channel = [
        inits[n.input[1]]
        for n in model.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].ndim >= 2
    ]
    assert per_channel and all(scale.size > 1 for scale in per_channel)
    assert [i.name for i in model.graph.input] == spec.input_names


def test_the_variant_plays_as_a_policy_from_its_file(int8_export: tuple[Path, ExportRef]) -> None:
    _, ref = int8_export
    path = Path(ref.path) / "policy.int8.onnx"
    assert variant_of(path) == "int8" and variant_of(ref.onnx) is None
    policy = load_acting_policy(path)
    assert isinstance(policy, OnnxRuntimePolicy) and policy.variant == "int8"
    assert policy.exported.variant == "int8", "the INT8 graph runs, not the FP32 one"


def test_the_bounded_memory_calibration_gives_onnx_runtimes_own_ranges(
    int8_export: tuple[Path, ExportRef], tmp_path: Path
) -> None:
    """quantize_int8 calibrates with its own session (no memory arena, no prepacking) and
    hands quantize_static the ranges: every scale and zero point is what quantize_static's
    own calibration on the same frames gives (to the last bit or so)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from stages.export.quantize import (
        CALIBRATION_BATCH,
        QUANTIZED_OPS,
        _Reader,
        layers_to_quantize,
        quantize_int8,
    )

    _, ref = int8_export
    fp32 = Path(ref.onnx)
    with np.load(Path(ref.path) / "reference.npz") as data:
        frames = {i.name: data[i.name] for i in onnx.load(str(fp32)).graph.input}
    layers = layers_to_quantize(fp32, [])
    quantize_int8(fp32, tmp_path / "ours.onnx", frames, False, layers, SMALL)
    quantize_static(
        str(fp32),
        str(tmp_path / "theirs.onnx"),
        _Reader(frames, CALIBRATION_BATCH),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=list(QUANTIZED_OPS),
        nodes_to_quantize=layers,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )

    def scales(name: str) -> dict[str, np.ndarray]:
        graph = onnx.load(str(tmp_path / name)).graph
        return {
            i.name: numpy_helper.to_array(i)
            for i in graph.initializer
            if i.name.endswith(("_scale", "_zero_point"))
        }

    ours, theirs = scales("ours.onnx"), scales("theirs.onnx")
    assert len(ours) > 2 * len(layers) and ours.keys() == theirs.keys()
    for name, value in theirs.items():  # the order of the runs may move a float by an ulp
        np.testing.assert_allclose(ours[name], value, rtol=1e-6, atol=0, err_msg=name)
    assert not list(tmp_path.glob(".calibration.*")), "the calibration scratch is removed"


def test_a_variant_past_the_error_bar_is_kept_but_not_a_candidate(
    int8_export: tuple[Path, ExportRef], tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    root, _ = int8_export
    strict = SMALL.model_copy(update={"max_relative_error": 1e-9})
    ref = export(
        root / "ckpt", tmp_path / "export", RP5.control_hz, dataset=tiny_dataset.path, config=strict
    )
    (int8,) = read_io_spec(ref.path).variants
    assert not int8.candidate
    assert "over the error bar (export.max_relative_error 0.0%)" in int8.reason
    assert int8.relative_error > 1e-9
    assert "policy.int8.onnx" in verify_bundle(ref.path), "kept in the bundle, marked"


def test_asymmetric_activations_make_a_uint8_cpu_variant(
    int8_export: tuple[Path, ExportRef], tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    """``export.int8_activations: asymmetric``: UINT8 activations with zero points (ONNX
    Runtime's fastest on x86), said so in the method, reused only for the same choice."""
    root, _ = int8_export
    cpu = SMALL.model_copy(update={"int8_activations": "asymmetric"})
    ref = export(
        root / "ckpt", tmp_path / "export", RP5.control_hz, dataset=tiny_dataset.path, config=cpu
    )
    (int8,) = ref.variants
    assert int8.method == UINT8_METHOD and int8.calibration["activations"] == "asymmetric"
    model = onnx.load(str(tmp_path / "export" / int8.onnx_file))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    zero_points = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(z.dtype == np.uint8 for z in zero_points)
    again = export(
        root / "ckpt", tmp_path / "export", RP5.control_hz, dataset=tiny_dataset.path, config=SMALL
    )
    assert again.variants[0].method == INT8_METHOD, "redone for symmetric activations"


def test_an_export_is_redone_when_its_variants_are_asked_for_differently(
    int8_export: tuple[Path, ExportRef], tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    root, first = int8_export
    out = tmp_path / "export"
    made = export(root / "ckpt", out, RP5.control_hz, dataset=tiny_dataset.path, config=SMALL)
    written = (out / "policy.int8.onnx").stat().st_mtime_ns
    assert (
        export(root / "ckpt", out, RP5.control_hz, dataset=tiny_dataset.path, config=SMALL) == made
    )
    assert (out / "policy.int8.onnx").stat().st_mtime_ns == written, "reused, not redone"
    # Made with another setting its maker records (the error bar): redone, not reused.
    stricter = SMALL.model_copy(update={"max_relative_error": SMALL.max_relative_error / 2})
    export(root / "ckpt", out, RP5.control_hz, dataset=tiny_dataset.path, config=stricter)
    assert (out / "policy.int8.onnx").stat().st_mtime_ns != written, "redone for a new bar"
    fp32_only = export(
        root / "ckpt",
        out,
        RP5.control_hz,
        dataset=tiny_dataset.path,
        config=ExportConfig(variants=[]),
    )
    assert fp32_only.variants == () and not list(out.glob("policy.int8.onnx*"))
    # Without a dataset there is nothing to calibrate on: FP32 only, and the record says why.
    bare = export(root / "ckpt", tmp_path / "bare", RP5.control_hz, config=SMALL)
    assert bare.variants == () and "no dataset" in bare.note
    assert bare.parameters == first.parameters > 0 and not bare.random_weights
    assert bare.export_seconds > 0 and bare.export_peak_rss_mb > 0


def test_rewriting_the_variants_figures_is_atomic_and_verifies(
    int8_export: tuple[Path, ExportRef], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shutil import copytree

    _, ref = int8_export
    out = tmp_path / "export"
    copytree(ref.path, out)
    (int8,) = read_io_spec(out).variants
    worse = replace(int8, success={"rate": 0.1, "fp32_rate": 0.9}, candidate=False, reason="r")
    spec = update_variants(out, (worse,))
    assert read_io_spec(out) == spec and spec.variants == (worse,)
    verify_bundle(out)
    with pytest.raises(ValueError, match="not the bundle's"):
        update_variants(out, (replace(int8, name="fp8"),))

    # A kill while rewriting leaves the old bundle, whole.
    import stages.export.onnx as module

    def killed(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "replace_dir", killed)
    with pytest.raises(KeyboardInterrupt):
        update_variants(out, (int8,))
    assert read_io_spec(out).variants == (worse,)
    verify_bundle(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"], "no partial copy left"
    (out / "io_spec.json").write_text((out / "io_spec.json").read_text().replace("0.1", "0.2"))
    with pytest.raises(IntegrityError):
        update_variants(out, (int8,))


def test_the_default_vla_int8_success_against_fp32_on_the_same_seeds(
    int8_export: tuple[Path, ExportRef], tmp_path: Path
) -> None:
    """The pipeline's evaluation step: the INT8 variant of a default-VLA export plays the
    held-out suite against the FP32 export with the no-regression gate's paired test, on the
    FP32 export's own seeds and outcomes (reused, not played again); worse makes it no
    candidate, and the figures land in the spec, rewritten whole."""
    from shutil import copytree

    from pipelines.config import load_config
    from pipelines.steps.evaluate import evaluate_policy, score_variant_success
    from stages.evaluate.report import EvalReport
    from tests.conftest import TINY_CONFIG

    _, made = int8_export
    out = tmp_path / "export"
    copytree(made.path, out)
    ref = replace(made, path=str(out), onnx=str(out / "policy.onnx"))
    # One look (the fixed design): the test is about which outcomes are paired, not when.
    cfg = load_config(
        TINY_CONFIG, ["export.score_success=true", "evaluate.sequential.enabled=false"]
    )
    fp32 = evaluate_policy(cfg, out, tmp_path / "evaluate")
    (int8,) = score_variant_success(cfg, ref, fp32, tmp_path / "evaluate")

    assert int8 == read_io_spec(out).variant("int8") and verify_bundle(out)
    written = (tmp_path / "evaluate-int8" / "eval_report.json").read_text()
    report = EvalReport.from_json(json.loads(written))
    c = report.comparison
    assert c is not None and c.baseline == str(out), "against the FP32 export"
    assert c.baseline_reused == fp32.episodes, "on the FP32 export's own seeds, not replayed"
    assert report.seeds == fp32.seeds
    assert int8.success == {
        "rate": report.success_rate,
        "fp32_rate": fp32.success_rate,
        "difference": report.success_rate - fp32.success_rate,
        "p_value": c.p_value,
        "episodes": float(fp32.episodes),
    }
    assert int8.candidate == c.passed

    # Against an FP32 that solved every seed, a policy that learned nothing is worse: not a
    # candidate, and the reason says why.
    solved = [{**o, "success": True} for o in fp32.outcomes]
    perfect = replace(fp32, outcomes=solved, successes=fp32.episodes, success_rate=1.0)
    (worse,) = score_variant_success(cfg, ref, perfect, tmp_path / "again")
    assert worse.success["fp32_rate"] == 1.0 and worse.success["p_value"] <= 0.05
    assert not worse.candidate and "worse by the paired test" in worse.reason
    assert read_io_spec(out).variant("int8") == worse and verify_bundle(out)
