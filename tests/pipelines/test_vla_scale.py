"""A hub-vlm size preset (``tiny``, random weights: a systems test) through the commands a user
types: ``robo-pipe export`` writes the FP32 graph and an INT8 variant calibrated and scored on
dataset frames; ``robo-pipe gate`` on a ``precision: auto`` profile chooses between them;
the registered version is never champion; ``robo-pipe deploy --systems-test`` puts it on a
running agent, which records the variant it chose, why not the other, and the systems test.

One test, ~40 s on two cores (an export, a gate and a deploy in subprocesses, an agent): the
issue's end-to-end check of the path at the size presets' architecture; the rules each step
applies are pinned by the faster tests of their own modules."""

from __future__ import annotations

import json
from pathlib import Path

from deploy_edge.bundle.io_spec import read_io_spec
from stages.dataset.layout import DatasetRef
from tests.pipelines.test_deploy import TOKEN, signing, start_agent, status
from tests.pipelines.test_flow import robo_pipe
from tests.stages.tiny_models import tiny_random_vlm

__all__ = ["signing"]  # the module's key pair fixture, shared with test_deploy


def test_the_tiny_preset_exports_gates_and_deploys_as_a_systems_test(
    tiny_dataset: DatasetRef, signing: dict[str, Path], shared_home: Path, tmp_path: Path
) -> None:
    checkpoint = tiny_random_vlm(tmp_path / "ckpt")
    out = tmp_path / "export"
    exported = robo_pipe(
        "export", checkpoint.path, "--out", str(out), "--dataset", tiny_dataset.path,
        "-c", "tiny.yaml", "--json", home=shared_home,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    spec = read_io_spec(out)
    assert spec.policy_type == "hub-vlm" and spec.random_weights and spec.parameters > 0
    assert set(spec.parity) == {"random", "dataset"} and spec.parity_max_abs_error <= 1e-4
    assert spec.export_seconds > 0 and spec.export_peak_rss_mb > 0
    int8 = spec.variant("int8")
    assert int8 is not None and int8.precision == "int8" and (out / int8.onnx_file).is_file()
    assert int8.candidate and 0 < int8.relative_error <= 0.05, int8
    calibration = int8.calibration
    assert int8.scored_frames > 0 and calibration["frames"] > 0
    assert calibration["episodes"] > 0 and calibration["scoring_episodes"] > 0
    assert robo_pipe("verify", str(out), home=shared_home).returncode == 0

    quick = ["--steps", "20", "--warmup", "2", "--no-pace", "--json"]
    gate = robo_pipe("gate", str(out), "--target", "local-cpu-auto", *quick, home=shared_home)
    assert gate.returncode == 0, gate.stderr[-3000:]
    report = json.loads(gate.stdout.strip().splitlines()[-1])
    trials = {t["variant"]: t for t in report["trials"]}
    assert set(trials) == {"fp32", "int8"} and all(t["p99_ms"] for t in trials.values())
    assert report["passed"] and report["variant"] == "fp32"  # both fit: the exact one runs

    from pipelines import tracking
    from pipelines.registry.exports import register_export
    from pipelines.registry.tags import ONNX_HASH_TAG
    from pipelines.services.settings import configure

    configure()
    run = tracking.TrackedRun.start("vla-scale-tests", "register")
    info = register_export(out, "tiny-vlm", run, {ONNX_HASH_TAG: "t"})
    run.finish()
    ref = f"models:/tiny-vlm/{info.version}"
    promoted = robo_pipe("models", "promote", ref, "--force", home=shared_home)
    assert promoted.returncode == 2 and "random weights" in promoted.stderr, promoted.stderr

    agent = start_agent(shared_home, tmp_path, target="local-cpu-auto")
    try:
        deployed = robo_pipe(
            "deploy", ref, "--device", "dev-arm-01", "--devices", str(agent["devices"]),
            "--key", str(signing["release"]), "--systems-test", "--json",
            home=shared_home, ARM_TOKEN=TOKEN,
        )  # fmt: skip
        assert deployed.returncode == 0, deployed.stderr[-3000:]
        record = json.loads(deployed.stdout.strip().splitlines()[-1])
        assert record["state"] == "active" and record["systems_test"]
        assert record["variant"] == "fp32"
        chosen = {t["variant"]: t for t in record["trials"]}
        assert chosen["int8"]["failure"].startswith("less accurate than fp32")
        active = status(agent)["active"]
        assert active["variant"] == "fp32" and active["systems_test"]
    finally:
        agent["process"].terminate()
        agent["process"].wait(timeout=20)
