"""Integrity on every load and a disk that fills up, through the CLI as a user meets them: a
flipped byte in a dataset, checkpoint or export is refused naming the file and the check (exit
2, nothing derived written); ``robo-pipe verify`` checks any of them; collect and export under a
file size limit fail with a named error, keep the previous output, and resume once it is gone.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from robots.rp5 import RP5
from stages.dataset.layout import DatasetRef
from tests.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]
TINY = str(TINY_CONFIG)
"""The tiny profile: shards of 4 episodes of 32 px frames; a shard's video is about 20 KB."""
LIMIT = 12_000
"""A file size limit (bytes) under a shard's video and an export's model, over every other
file those commands write."""


def cli(*args: str, home: Path, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    """``robo-pipe ARGS`` in a child process; ``limit``: its file size limit (RLIMIT_FSIZE), as
    a disk that fills up (Python ignores SIGXFSZ: a write past it fails with EFBIG)."""

    def lower_limit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lower_limit,
    )


def refused(result: subprocess.CompletedProcess[str], *words: str, code: int = 2) -> None:
    """Exit ``code`` (2: bad input; 1: ``verify``'s verdict that a check failed) with one named
    error and no traceback, mentioning every one of ``words``."""
    text = " ".join(result.stderr.split())  # the console wraps long lines
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in text, (word, result.stderr)


def flip_byte(path: Path) -> None:
    """Change one byte in the middle of ``path``; its size stays."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def save_checkpoint(path: Path, seed: int) -> Path:
    import torch

    from stages.policy.checkpoint import new_policy, save_policy
    from tests.stages.tiny_models import TINY_POLICY

    torch.manual_seed(seed)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    save_policy(policy, path, None)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint (``ckpt``) and its export (``export``), made once: tests copy them."""
    from stages.export import export

    root = tmp_path_factory.mktemp("exported")
    export(save_checkpoint(root / "ckpt", seed=0), root / "export", RP5.control_hz)
    return root


def copy_exported(exported: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the ``exported`` checkpoint and export in ``tmp_path``: (checkpoint, export)."""
    for name in ("ckpt", "export"):
        shutil.copytree(exported / name, tmp_path / name)
    return tmp_path / "ckpt", tmp_path / "export"


def sign_release(export: Path, out: Path) -> Path:
    """``export`` signed into the release file ``out`` with a new key."""
    from deploy_edge.keys import generate_keypair, load_private_key
    from deploy_edge.release.signature import write_release

    private, _ = generate_keypair(out.parent / "keys")
    write_release(
        export,
        out,
        load_private_key(private),
        model_name="policy",
        model_version="1",
        run_id="run",
        release=1,
    )
    return out


def test_verify_and_every_stage_refuse_a_flipped_byte_in_any_artifact(
    robo_pipe_home: Path, tmp_path: Path, tiny_dataset: DatasetRef, exported: Path
) -> None:
    dataset = tmp_path / "ds"
    shutil.copytree(tiny_dataset.path, dataset)
    checkpoint, export = copy_exported(exported, tmp_path)
    release = sign_release(export, tmp_path / "policy.release")
    artifacts = {
        "dataset": dataset,
        "checkpoint": checkpoint,
        "export": export,
        "release": release,
    }

    ok = cli("verify", *map(str, artifacts.values()), "--json", home=robo_pipe_home)
    assert ok.returncode == 0, ok.stderr
    records = json.loads(ok.stdout.splitlines()[-1])
    assert [(r["kind"], r["path"]) for r in records] == [(k, str(p)) for k, p in artifacts.items()]
    assert all(r["files"] >= 3 and r["bytes"] > 0 for r in records)

    flipped = {
        "dataset": dataset / "data/chunk-000/file-000.parquet",
        "checkpoint": checkpoint / "model.safetensors",
        "export": export / "policy.onnx",
    }
    for path in flipped.values():
        flip_byte(path)
    with tarfile.open(release) as tar:  # a byte of the model inside the release
        member = tar.getmember("bundle/policy.onnx")
    with release.open("r+b") as f:
        f.seek(member.offset_data + member.size // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))
    bad = cli("verify", *map(str, artifacts.values()), home=robo_pipe_home)
    refused(
        bad,
        *(f"{path}: sha256 check failed" for path in flipped.values()),
        f"{release}: bundle file 'policy.onnx' has sha256",
        code=1,
    )

    # Each stage refuses it when it opens it, before it writes anything.
    out = tmp_path / "from-a-flipped-checkpoint"
    made = cli("export", str(checkpoint), "--out", str(out), home=robo_pipe_home)
    refused(made, f"{flipped['checkpoint']}: sha256 check failed")
    assert not out.exists() and not list(tmp_path.glob(".*.tmp-*")), "nothing written"
    flip_byte(flipped["checkpoint"])  # as it was; the dataset still has its flipped byte
    with_data = ["export", str(checkpoint), "--out", str(out), "--dataset", str(dataset)]
    refused(cli(*with_data, home=robo_pipe_home), f"{flipped['dataset']}: sha256 check failed")
    assert not out.exists()
    gate = cli("gate", str(export), "--steps", "5", "--no-pace", home=robo_pipe_home)
    refused(gate, f"{flipped['export']}: sha256 check failed")
    assert not list((robo_pipe_home / "runs").glob("*/latency_report.json"))


def test_a_truncated_or_missing_video_or_no_checksums_is_a_named_error(
    robo_pipe_home: Path, tmp_path: Path, tiny_dataset: DatasetRef
) -> None:
    truncated, unchecked = tmp_path / "truncated", tmp_path / "unchecked"
    for copy in (truncated, unchecked):
        shutil.copytree(tiny_dataset.path, copy)
    video = "videos/observation.images.scene/chunk-000/file-001.mp4"
    (truncated / video).write_bytes((truncated / video).read_bytes()[:1000])
    (unchecked / "meta/checksums.json").unlink()
    refused(
        cli("verify", str(truncated), str(unchecked), home=robo_pipe_home),
        f"{truncated / video}: size check failed",
        f"{unchecked / 'meta/checksums.json'}: checksums check failed: no checksums",
        "re-run robo-pipe collect",
        code=1,
    )
    (truncated / video).unlink()
    checkpoint = save_checkpoint(tmp_path / "ckpt", seed=0)
    export = cli("export", str(checkpoint), "--dataset", str(truncated), home=robo_pipe_home)
    refused(export, f"{truncated / video}: missing check failed")


def test_collect_on_a_full_disk_keeps_what_it_had_and_resumes(
    robo_pipe_home: Path, tmp_path: Path
) -> None:
    from stages.dataset.reader import open_dataset

    out = tmp_path / "ds"
    collect = ["collect", "--config", TINY, "--out", str(out)]
    first = cli(*collect, "--episodes", "4", home=robo_pipe_home)
    assert first.returncode == 0, first.stderr
    shard = out / ".staging" / "shard-00000000-00000004"
    video = shard / "scene.mp4"  # its directory is linked anew by each finalize; its files not
    committed = video.stat().st_ino, video.stat().st_mtime_ns

    full = cli(*collect, "--episodes", "8", home=robo_pipe_home, limit=LIMIT)
    refused(full, "the disk is full", "shard-00000004-00000008", "re-run the same command")
    staged = sorted(p.name for p in (out / ".staging").iterdir())
    assert staged == ["collection.json", shard.name], "no half shard"
    assert open_dataset(out).num_episodes == 4, "the complete dataset is untouched"

    resumed = cli(*collect, "--episodes", "8", "--json", home=robo_pipe_home)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 of 2 shards already committed" in resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["episodes"] == 8
    assert (video.stat().st_ino, video.stat().st_mtime_ns) == committed, "not collected again"


def test_collect_rebuilds_a_finished_dataset_that_fails_its_checks(
    robo_pipe_home: Path, tmp_path: Path
) -> None:
    """A finished dataset is reused as it is only if it verifies: one with a flipped byte is
    finalized again from its committed shards (the source of truth), to the same content."""
    out = tmp_path / "ds"
    collect = ["collect", "--config", TINY, "--out", str(out), "--json"]
    first = cli(*collect, "--episodes", "4", home=robo_pipe_home)
    assert first.returncode == 0, first.stderr
    flip_byte(out / "data/chunk-000/file-000.parquet")

    again = cli(*collect, "--episodes", "4", home=robo_pipe_home)

    assert again.returncode == 0, again.stderr
    assert "fails its checks" in again.stderr and "rebuilding it" in again.stderr
    hashes = [json.loads(r.stdout.splitlines()[-1])["content_hash"] for r in (first, again)]
    assert hashes[0] == hashes[1]
    assert cli("verify", str(out), home=robo_pipe_home).returncode == 0


def test_export_on_a_full_disk_keeps_the_previous_export_and_resumes(
    robo_pipe_home: Path, tmp_path: Path, exported: Path
) -> None:
    from deploy_edge.bundle.files import verify_bundle
    from deploy_edge.bundle.io_spec import read_io_spec

    checkpoint, out = copy_exported(exported, tmp_path)
    previous = read_io_spec(out)
    save_checkpoint(checkpoint, seed=1)  # trained further: a new export replaces the old

    again = ["export", str(checkpoint), "--out", str(out), "--json"]
    full = cli(*again, home=robo_pipe_home, limit=LIMIT)
    refused(full, "the disk is full", f"{out} is as it was", "re-run the same command")
    assert not list(tmp_path.glob(".*.tmp-*")), "no partial export"
    verify_bundle(out)
    assert read_io_spec(out).checkpoint_hash == previous.checkpoint_hash

    resumed = cli(*again, home=robo_pipe_home)
    assert resumed.returncode == 0, resumed.stderr
    record = json.loads(resumed.stdout.splitlines()[-1])
    assert record["checkpoint_hash"] != previous.checkpoint_hash


def test_verify_names_what_it_cannot_verify(robo_pipe_home: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    result = cli(
        "verify", str(tmp_path / "notes.txt"), str(tmp_path / "empty"), home=robo_pipe_home
    )
    refused(result, f"{tmp_path / 'notes.txt'}: not a release file", f"{tmp_path / 'empty'}: not a")
