"""Delta uploads through the deploy client and a running agent: a device that holds a release
is sent only the pieces of the next one it lacks, assembles the release byte for byte, refuses a
tampered piece, and a cut delta upload resumes from the pieces it verified.

Pieces are cut at 4 KiB here (the tiny release is ~100 KiB; the product cuts at 1 MiB), so that
the tiny export's files span many pieces as a large model's do."""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy_edge.agent.pieces import PieceStore
from deploy_edge.keys import load_private_key
from deploy_edge.release import pieces as piece_module
from deploy_edge.release.header import BUNDLE_DIR
from deploy_edge.release.pieces import Piece, batch_body, bundle_pieces, release_pieces
from deploy_edge.release.signature import write_release
from tests.deploy_edge.test_deployer import keys, releases
from tests.deploy_edge.test_uploads import AUTH, client, config, running_agent, sha

__all__ = ["keys", "releases"]  # the fixtures this module shares with the deployer's tests

SMALL = 4096


def put_piece(url: str, data: bytes, piece: Piece, content: bytes | None = None) -> httpx.Response:
    """Send one piece of the release ``data`` by hand (what the client does), or ``content``
    under its sha256."""
    if content is None:
        content = data[piece.offset : piece.offset + piece.size]
    body = batch_body([(piece.sha256, content)])
    return httpx.put(f"{url}/pieces", content=body, headers=AUTH)


def assemble(url: str, sha256: str, size: int, recipe: list[list[Any]]) -> httpx.Response:
    body = {"size": size, "pieces": recipe}
    return httpx.post(f"{url}/uploads/{sha256}/assemble", json=body, headers=AUTH)


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 KiB pieces on both sides (the agent runs in this process)."""
    monkeypatch.setattr(piece_module, "PIECE_BYTES", SMALL)


@pytest.fixture(scope="module")
def fine_tuned(
    tmp_path_factory: pytest.TempPathFactory, export_dir: Path, keys: tuple[Path, Path]
) -> Path:
    """Release 2: the tiny export's policy with one tensor changed (a fine-tune's), exported
    and signed as the pipeline does."""
    import torch

    from stages.export import export
    from stages.policy.checkpoint import load_policy, save_policy

    root = tmp_path_factory.mktemp("fine-tuned")
    policy = load_policy(export_dir.parent / "ckpt")
    head = [p for p in policy.parameters() if p.ndim == 2][-1]
    with torch.no_grad():
        head.add_(0.01)
    save_policy(policy, root / "ckpt", None)
    out = Path(export(root / "ckpt", root / "export", 10.0).path)
    release = root / "2.release"
    write_release(
        out,
        release,
        load_private_key(keys[0]),
        model_name="tiny",
        model_version="2",
        run_id="run-2",
        release=2,
    )
    return release


@pytest.fixture
def holding_release_1(
    tmp_path: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> Iterator[tuple[str, Path]]:
    """A running agent whose active version is release 1 (sent whole); its URL and state."""
    device = config(tmp_path / "state", keys[1], max_release_mb=1.0)
    with running_agent(device) as url:
        first = releases(1)
        client(url).upload(first, sha(first.read_bytes()), delta=False)
        assert client(url).deploy(sha(first.read_bytes())).state == "active"
        yield url, tmp_path / "state"


def test_a_fine_tune_sends_only_the_pieces_the_device_lacks(
    holding_release_1: tuple[str, Path], fine_tuned: Path
) -> None:
    url, state = holding_release_1
    data = fine_tuned.read_bytes()
    pieces = release_pieces(fine_tuned)
    assert len(pieces) > 40
    assert b"".join(data[p.offset : p.offset + p.size] for p in pieces) == data, "every byte once"
    progress: list[tuple[int, int]] = []
    sent = client(url).upload(fine_tuned, sha(data), lambda *done: progress.append(done))
    assert sent.size == len(data) and sent.pieces == len(pieces)
    assert 0 < sent.pieces_sent < sent.pieces / 2, sent.summary
    assert sent.sent <= sent.pieces_sent * SMALL < len(data) / 2, sent.summary
    assert progress[-1] == (sent.sent, sent.sent)
    assert "the device held" in sent.summary and f"of {len(data) / 1e6:.1f} MB sent" in sent.summary
    assembled = state / "uploads" / f"{sha(data)}.release"
    assert assembled.read_bytes() == data, "byte for byte the release"
    assert list((state / "pieces").iterdir()) == [], "the sent pieces went into the upload"
    # complete on the device (a refused deployment retried with --force, say): nothing again
    assert client(url).upload(fine_tuned, sha(data)).sent == 0
    done = client(url).deploy(sha(data))
    assert done.state == "active" and done.model_version == "2", done.reason
    again = client(url).upload(fine_tuned, sha(data))
    # the slot holds every bundle file: only the tar's headers and the signed manifest go again
    with tarfile.open(fine_tuned) as tar:
        in_bundle = sum(m.size for m in tar.getmembers() if m.name.startswith(f"{BUNDLE_DIR}/"))
    assert 0 < again.sent <= len(data) - in_bundle, again.summary


def test_a_tampered_piece_is_refused_and_nothing_of_it_is_kept(
    holding_release_1: tuple[str, Path], fine_tuned: Path
) -> None:
    url, state = holding_release_1
    data = fine_tuned.read_bytes()
    pieces = release_pieces(fine_tuned)
    missing = httpx.post(
        f"{url}/pieces/missing", json={"pieces": [p.sha256 for p in pieces]}, headers=AUTH
    ).json()["missing"]
    piece = next(p for p in pieces if p.sha256 == missing[0])
    genuine = data[piece.offset : piece.offset + piece.size]
    tampered = bytes([genuine[0] ^ 1]) + genuine[1:]
    refused = put_piece(url, data, piece, tampered)
    assert refused.status_code == 422 and refused.json()["detail"]["reason"] == "hash-mismatch"
    assert list((state / "pieces").iterdir()) == []
    recipe = [[p.sha256, p.size] for p in pieces]
    early = assemble(url, sha(data), len(data), recipe)
    assert early.status_code == 409 and early.json()["detail"]["reason"] == "missing-pieces"
    assert list((state / "uploads").iterdir()) == [], "nothing written before the refusal"
    short = assemble(url, sha(data), len(data) + 1, recipe)
    assert short.status_code == 409 and "adding up to" in short.json()["detail"]["message"]
    big = httpx.put(f"{url}/pieces", content=b"x" * (9 << 20), headers=AUTH)
    assert big.status_code == 413 and big.json()["detail"]["reason"] == "too-large"
    lying = batch_body([(piece.sha256, genuine)])[:-1]  # a byte short of what it lists
    short_batch = httpx.put(f"{url}/pieces", content=lying, headers=AUTH)
    assert short_batch.status_code == 400 and short_batch.json()["detail"]["reason"] == "bad-batch"
    mixed = batch_body([(piece.sha256, genuine), (missing[1], b"not it")])
    half_kept = httpx.put(f"{url}/pieces", content=mixed, headers=AUTH)
    assert half_kept.status_code == 422 and "1 before it were" in half_kept.text
    assert [p.name for p in (state / "pieces").iterdir()] == [piece.sha256], "the good one"


def test_held_pieces_in_the_wrong_order_never_become_a_release(
    holding_release_1: tuple[str, Path], releases: Callable[..., Path]
) -> None:
    """A recipe of pieces the device holds, swapped: the assembled bytes do not hash to the
    release, so the upload is deleted and refused; the client's own upload then succeeds."""
    url, state = holding_release_1
    release = releases(3)
    data = release.read_bytes()
    pieces = release_pieces(release)
    recipe = [[p.sha256, p.size] for p in pieces]
    first, second = next(
        (i, i + 1)
        for i in range(len(pieces) - 1)
        if pieces[i].size == pieces[i + 1].size and pieces[i].sha256 != pieces[i + 1].sha256
    )
    recipe[first], recipe[second] = recipe[second], recipe[first]
    client(url).upload(release, sha(data))  # every piece on the device now
    client(url).delete_upload(sha(data))
    for p in pieces:  # as sent pieces again, since the completed upload consumed them
        assert put_piece(url, data, p).status_code == 200
    wrong = assemble(url, sha(data), len(data), recipe)
    assert wrong.status_code == 422 and wrong.json()["detail"]["reason"] == "hash-mismatch"
    assert not (state / "uploads" / f"{sha(data)}.release").exists()
    assert client(url).upload(release, sha(data)).pieces_sent == 0
    assert client(url).deploy(sha(data)).state == "active"


def test_a_cut_delta_upload_resumes_from_the_pieces_it_verified(
    holding_release_1: tuple[str, Path], fine_tuned: Path
) -> None:
    url, _ = holding_release_1
    data = fine_tuned.read_bytes()
    pieces = {p.sha256: p for p in release_pieces(fine_tuned)}
    missing = httpx.post(
        f"{url}/pieces/missing", json={"pieces": list(pieces)}, headers=AUTH
    ).json()["missing"]
    half = missing[: len(missing) // 2]
    for name in half:  # the connection drops after these
        assert put_piece(url, data, pieces[name]).status_code == 200
    sent = client(url).upload(fine_tuned, sha(data))
    assert sent.pieces_sent == len(missing) - len(half), "only what was still missing"
    assert client(url).deploy(sha(data)).state == "active"


def test_pieces_untouched_past_the_upload_age_expire(tmp_path: Path) -> None:
    import os

    from deploy_edge.agent.uploads import UploadStore

    folder = tmp_path / "pieces"
    folder.mkdir()
    old, fresh = folder / ("b" * 64), folder / ("c" * 64)
    old.write_bytes(b"old")
    fresh.write_bytes(b"fresh")
    os.utime(old, (0, 0))
    uploads = UploadStore(tmp_path / "uploads", 1 << 20, 0, 3600.0)
    PieceStore(folder, list, uploads, max_age_s=3600.0)
    assert not old.exists() and fresh.exists()


def test_an_agent_without_delta_uploads_is_sent_the_whole_file(
    tmp_path: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    """An agent from before delta uploads answers 404 to the pieces: the client sends the
    release whole, as before, and it deploys."""
    from deploy_edge.agent.deployer import Deployer
    from deploy_edge.agent.service import create_app

    device = config(tmp_path / "state", keys[1])
    app = create_app(device, Deployer(device))
    delta_routes = ("/pieces/missing", "/pieces", "/uploads/{sha256}/assemble")
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") not in delta_routes]
    with running_agent(device, app) as url:
        release = releases(1)
        sent = client(url).upload(release, sha(release.read_bytes()))
        assert sent.pieces == 0 and sent.sent == sent.size == release.stat().st_size
        assert client(url).deploy(sha(release.read_bytes())).state == "active"


def new_share(lora: str, base_dir: Path, out: Path) -> float:
    """Two LoRA fine-tunes of the checkpoint ``base_dir`` (their adapters and heads moved, the
    base untouched), exported with ``export.lora: <lora>``: the share of the second export's
    bytes in pieces the first's files do not hold."""
    import torch

    from stages.export import export
    from stages.export.config import ExportConfig
    from stages.policy.checkpoint import checkpoint_hash, load_policy, save_policy
    from stages.policy.config import LoraSettings
    from stages.policy.types import CHECKPOINT_BASE, BaseRef

    base = BaseRef(CHECKPOINT_BASE, str(base_dir), checkpoint_hash(base_dir))
    bundles: list[Path] = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        policy = load_policy(base_dir)
        policy.add_lora(LoraSettings())
        with torch.no_grad():
            for param in (p for p in policy.parameters() if p.requires_grad):
                param.add_(torch.randn_like(param) * 0.01)
        save_policy(policy, out / f"{lora}-ckpt-{seed}", base)
        config = ExportConfig.model_validate({"variants": [], "lora": lora})
        done = export(out / f"{lora}-ckpt-{seed}", out / f"{lora}-{seed}", 10.0, config=config)
        bundles.append(Path(done.path))
    # every weight lives in policy.onnx.data, however small: the graph file does not change
    assert (bundles[0] / "policy.onnx").read_bytes() == (bundles[1] / "policy.onnx").read_bytes()
    held = {p.sha256 for _, p in bundle_pieces(bundles[0])}
    fresh = [p for _, p in bundle_pieces(bundles[1]) if p.sha256 not in held]
    size = sum(f.stat().st_size for f in bundles[1].rglob("*") if f.is_file())
    return sum(p.size for p in fresh) / size


def test_separate_adapters_leave_the_base_weights_for_the_device_to_reuse(
    export_dir: Path, tmp_path: Path
) -> None:
    """With ``export.lora: separate`` a second fine-tune's new pieces are its adapters, heads
    and metadata. Merged, LoRA rewrites every adapted matrix too: measured on this tiny VLA
    (seeded, so the same each run), 26% separate against 61% merged (most of the 26% is
    ``reference.npz``, whose torch outputs change with any weight)."""
    separate = new_share("separate", export_dir.parent / "ckpt", tmp_path)
    merged = new_share("merged", export_dir.parent / "ckpt", tmp_path)
    assert separate < merged / 2, f"{separate:.1%} of the second is new, merged {merged:.1%}"
