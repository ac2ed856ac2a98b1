"""Signed releases at library level: keys; the round trip (write, verify, extract, read the
spec); the signature matrix; hand-crafted tar attacks on extraction (PEP 706); members larger
than their signed size, compressed releases (a gzip bomb) and the size cap; an ONNX model whose
external data points outside its bundle; expiry and downgrade, refused and forced. Every refusal
leaves nothing at the destination nor a staging directory beside it."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import onnx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deploy_edge.bundle.files import bundle_files, write_bundle_checksums
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.bundle.layout import IO_SPEC_FILE, ONNX_FILE
from deploy_edge.keys import (
    SigningKeyError,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
)
from deploy_edge.release.header import (
    BUNDLE_DIR,
    MANIFEST_FILE,
    RELEASE_FORMAT,
    RELEASE_FORMAT_VERSION,
    SIGNATURE_FILE,
    ReleaseError,
)
from deploy_edge.release.manifest import Manifest, check_policy, read_manifest
from deploy_edge.release.payload import extract_release
from deploy_edge.release.signature import verify_release, write_release
from robo_pipe.errors import InputError, RoboPipeError

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
Member = tuple[tarfile.TarInfo, bytes]


def _release(
    export_dir: Path,
    out: Path,
    key: Ed25519PrivateKey,
    *,
    release: int = 3,
    **options: Any,
) -> Manifest:
    return write_release(
        export_dir,
        out,
        key,
        model_name="pick-place",
        model_version="7",
        run_id="run-1",
        release=release,
        now=options.pop("now", NOW),
        **options,
    )


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture()
def signed(export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path) -> tuple[Path, Manifest]:
    file = tmp_path / "release.tar"
    return file, _release(export_dir, file, key)


def _members(file: Path) -> list[Member]:
    with tarfile.open(file) as tar:
        out = []
        for info in tar.getmembers():
            data = tar.extractfile(info) if info.isreg() else None
            out.append((info, data.read() if data else b""))
        return out


def _write_tar(file: Path, members: list[Member]) -> Path:
    with tarfile.open(file, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return file


def _regular(name: str, data: bytes = b"x") -> Member:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info, b""


def _rewrite(file: Path, edit: Callable[[list[Member]], list[Member]]) -> Path:
    """``file`` with its members passed through ``edit`` (in place)."""
    return _write_tar(file, edit(_members(file)))


def _resign(file: Path, key: Ed25519PrivateKey, edit: Callable[[dict[str, Any]], None]) -> Path:
    """``file`` with its manifest edited and signed again by ``key`` (a trusted signer that
    signs something bad, or a format a device must refuse despite a good signature)."""

    def change(members: list[Member]) -> list[Member]:
        out = []
        for info, data in members:
            if info.name == MANIFEST_FILE:
                manifest = json.loads(data)
                edit(manifest)
                data = json.dumps(manifest).encode()
                manifest_bytes = data
            out.append((info, data))
        sig = {
            "algorithm": "ed25519",
            "key_id": key_id(key.public_key()),
            "signature": base64.b64encode(key.sign(manifest_bytes)).decode(),
        }
        return [
            (i, json.dumps(sig).encode()) if i.name == SIGNATURE_FILE else (i, d) for i, d in out
        ]

    return _rewrite(file, change)


def _refused(reason: str, call: Callable[[], object]) -> ReleaseError:
    with pytest.raises(ReleaseError) as caught:
        call()
    assert caught.value.reason == reason, str(caught.value)
    assert isinstance(caught.value, RoboPipeError)
    return caught.value


def _assert_nothing_left(dest: Path) -> None:
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if ".staging-" in p.name], "staging left over"


@pytest.fixture()
def staged(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """What a refused extraction had written when its staging directory was removed (the most
    it ever held: files are only added): staging-relative path -> bytes. Empty when no staging
    directory was made."""
    import deploy_edge.release.payload as release_module

    found: dict[str, int] = {}
    rmtree = shutil.rmtree

    def watching(path: Any, *args: Any, **kwargs: Any) -> None:
        root = Path(path)
        if root.is_dir():
            for item in root.rglob("*"):
                if item.is_file():
                    found[item.relative_to(root).as_posix()] = item.stat().st_size
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(release_module.shutil, "rmtree", watching)
    return found


# --- keys ---


def test_generate_keypair_writes_pem_files_and_never_overwrites(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair(tmp_path / "keys", "ci")
    assert (private_path.name, public_path.name) == ("ci.key", "ci.pub")
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    private, public = load_private_key(private_path), load_public_key(public_path)
    assert key_id(private.public_key()) == key_id(public)
    assert len(key_id(public)) == 16 and int(key_id(public), 16) >= 0
    public.verify(private.sign(b"payload"), b"payload")
    before = private_path.read_bytes()
    with pytest.raises(SigningKeyError, match=r"ci\.key"):
        generate_keypair(tmp_path / "keys", "ci")
    assert private_path.read_bytes() == before
    assert key_id(Ed25519PrivateKey.generate().public_key()) != key_id(public)


def test_unusable_key_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    private_path, public_path = generate_keypair(tmp_path)
    with pytest.raises(SigningKeyError, match=r"missing\.pub"):
        load_public_key(tmp_path / "missing.pub")
    with pytest.raises(SigningKeyError, match=r"robo-pipe\.key.*\.pub"):
        load_public_key(private_path)
    with pytest.raises(SigningKeyError, match=r"robo-pipe\.pub.*\.key"):
        load_private_key(public_path)
    rsa_path = tmp_path / "rsa.key"
    rsa_path.write_bytes(
        rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(SigningKeyError, match=r"rsa\.key.*Ed25519"):
        load_private_key(rsa_path)
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("not a key")
    with pytest.raises(SigningKeyError, match=r"garbage\.pub"):
        load_public_key(garbage)
    with pytest.raises(SigningKeyError):
        generate_keypair(tmp_path, "../escape")


# --- round trip ---


def test_round_trip_write_verify_extract(
    export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    file = tmp_path / "out" / "release.tar"
    manifest = _release(export_dir, file, key, targets=["jetson-orin"], budget_ms=20.0)
    assert (manifest.format, manifest.format_version) == (RELEASE_FORMAT, RELEASE_FORMAT_VERSION)
    assert manifest.key_id == key_id(key.public_key())
    assert manifest.created_at == "2026-05-01T12:00:00Z"
    assert manifest.expires_at == "2026-05-31T12:00:00Z"
    assert set(manifest.files) == {p.as_posix() for p in bundle_files(export_dir)}
    assert manifest.sizes == {
        p.as_posix(): (export_dir / p).stat().st_size for p in bundle_files(export_dir)
    }
    assert manifest.io_spec == read_io_spec(export_dir)
    assert Manifest.from_json(json.loads(json.dumps(manifest.to_json()))) == manifest
    names = [info.name for info, _ in _members(file)]
    assert names[:2] == [MANIFEST_FILE, SIGNATURE_FILE]
    assert names[2:] == sorted(f"{BUNDLE_DIR}/{p.as_posix()}" for p in bundle_files(export_dir))
    assert [p.name for p in file.parent.iterdir()] == ["release.tar"], "no temporary left"

    assert read_manifest(file) == manifest
    assert verify_release(file, [key.public_key()]) == manifest
    assert check_policy(manifest, floor=2, now=NOW) == []
    assert check_policy(manifest, floor=3, now=NOW) == [], "reinstalling is allowed"
    bundle = extract_release(file, manifest, tmp_path / "installed" / "r3")
    assert bundle == tmp_path / "installed" / "r3" / BUNDLE_DIR
    assert read_io_spec(bundle) == manifest.io_spec
    assert {p.as_posix() for p in bundle_files(bundle)} == set(manifest.files)
    for rel in manifest.files:
        assert (bundle / rel).read_bytes() == (export_dir / rel).read_bytes()
    installed_manifest = json.loads((bundle.parent / MANIFEST_FILE).read_text())
    assert Manifest.from_json(installed_manifest) == manifest
    assert (bundle.parent / SIGNATURE_FILE).is_file()
    assert [p.name for p in (tmp_path / "installed").iterdir()] == ["r3"]


def test_the_release_file_is_deterministic(
    export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    _release(export_dir, tmp_path / "a.tar", key)
    _release(export_dir, tmp_path / "b.tar", key)
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_a_release_that_never_expires(
    export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    file = tmp_path / "release.tar"
    manifest = _release(export_dir, file, key, expires_in_days=None)
    assert manifest.expires_at is None
    assert check_policy(manifest, floor=None, now=NOW + timedelta(days=10_000)) == []


# --- the signature matrix ---


def _drop_signature(members: list[Member]) -> list[Member]:
    return [(i, d) for i, d in members if i.name != SIGNATURE_FILE]


def _edit_manifest(members: list[Member]) -> list[Member]:
    out = []
    for info, data in members:
        if info.name == MANIFEST_FILE:
            data = data.replace(b'"release": 3', b'"release": 9')
            assert b'"release": 9' in data
        out.append((info, data))
    return out


def _bad_signature_bytes(members: list[Member]) -> list[Member]:
    out = []
    for info, data in members:
        if info.name == SIGNATURE_FILE:
            sig = json.loads(data)
            raw = bytearray(base64.b64decode(sig["signature"]))
            raw[0] ^= 1
            sig["signature"] = base64.b64encode(bytes(raw)).decode()
            data = json.dumps(sig).encode()
        out.append((info, data))
    return out


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_drop_signature, "unsigned"),
        (_edit_manifest, "bad-signature"),
        (_bad_signature_bytes, "bad-signature"),
        (lambda ms: [(i, d) for i, d in ms if i.name != MANIFEST_FILE], "bad-format"),
    ],
    ids=["unsigned", "manifest-edited-after-signing", "signature-flipped", "no-manifest"],
)
def test_verify_refuses_a_tampered_signature_or_manifest(
    signed: tuple[Path, Manifest],
    key: Ed25519PrivateKey,
    edit: Callable[[list[Member]], list[Member]],
    reason: str,
) -> None:
    file, _ = signed
    _refused(reason, lambda: verify_release(_rewrite(file, edit), [key.public_key()]))


def test_verify_refuses_without_trusted_keys_and_with_an_untrusted_key(
    signed: tuple[Path, Manifest], key: Ed25519PrivateKey
) -> None:
    file, _ = signed
    _refused("no-trusted-keys", lambda: verify_release(file, []))
    other = Ed25519PrivateKey.generate().public_key()
    error = _refused("untrusted-key", lambda: verify_release(file, [other]))
    assert key_id(key.public_key()) in str(error) and str(file) in str(error)


def test_key_rotation(export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path) -> None:
    new = Ed25519PrivateKey.generate()
    old_release, new_release = tmp_path / "old.tar", tmp_path / "new.tar"
    _release(export_dir, old_release, key, release=1)
    _release(export_dir, new_release, new, release=2)
    both = [key.public_key(), new.public_key()]
    assert verify_release(old_release, both).release == 1
    assert verify_release(new_release, both).release == 2
    rotated = [new.public_key()]
    _refused("untrusted-key", lambda: verify_release(old_release, rotated))
    assert verify_release(new_release, rotated).key_id == key_id(new.public_key())


def test_a_trusted_signature_over_a_foreign_format_is_refused(
    signed: tuple[Path, Manifest], key: Ed25519PrivateKey
) -> None:
    file, _ = signed
    _resign(file, key, lambda m: m.update(format_version=RELEASE_FORMAT_VERSION + 1))
    error = _refused("bad-format", lambda: verify_release(file, [key.public_key()]))
    assert "format_version" in str(error)
    _resign(file, key, lambda m: m.update(format="something-else", format_version=1))
    _refused("bad-format", lambda: verify_release(file, [key.public_key()]))
    # Version 2 had no gated_* fields: its reader would not hold a device to the gated figure.
    _resign(file, key, lambda m: m.update(format=RELEASE_FORMAT, format_version=2))
    error = _refused("bad-format", lambda: verify_release(file, [key.public_key()]))
    assert "'format_version' = 2: written by an older robo-pipe" in str(error)
    _resign(file, key, lambda m: m.update(format_version=RELEASE_FORMAT_VERSION))
    _resign(file, key, lambda m: m["sizes"].update({"../escape.bin": 1}))
    error = _refused("bad-format", lambda: verify_release(file, [key.public_key()]))
    assert "'files' and 'sizes'" in str(error) and "'../escape.bin'" in str(error)
    _resign(file, key, lambda m: m["files"].update({"../escape.bin": "0" * 64}))
    _refused("unsafe-path", lambda: verify_release(file, [key.public_key()]))


def test_a_version_1_manifest_is_refused_with_how_to_sign_it_again(
    signed: tuple[Path, Manifest], key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """Version 1 signed no sizes: a device cannot bound what it writes, so it refuses it (even
    signed by a trusted key) and says how to make a version 2 release of the same model."""
    file, _ = signed

    def version_1(manifest: dict[str, Any]) -> None:
        manifest["format_version"] = 1
        del manifest["sizes"]

    _resign(file, key, version_1)
    for read in (lambda: verify_release(file, [key.public_key()]), lambda: read_manifest(file)):
        error = _refused("bad-format", read)
        assert "'format_version' = 1: written by an older robo-pipe" in str(error)
        assert "robo-pipe bundle models:/pick-place/7" in str(error)


@pytest.mark.parametrize("content", [b"", b"not a tar file at all" * 100])
def test_an_unreadable_file_is_corrupt(
    tmp_path: Path, key: Ed25519PrivateKey, content: bytes
) -> None:
    file = tmp_path / "release.tar"
    file.write_bytes(content)
    _refused("corrupt", lambda: verify_release(file, [key.public_key()]))
    _refused("corrupt", lambda: read_manifest(tmp_path / "absent.tar"))


def _flip_payload_byte(members: list[Member]) -> list[Member]:
    out = []
    for info, data in members:
        if info.name == f"{BUNDLE_DIR}/{ONNX_FILE}":
            data = bytes([data[0] ^ 1]) + data[1:]
        out.append((info, data))
    return out


def _add_file(members: list[Member]) -> list[Member]:
    return [*members, _regular(f"{BUNDLE_DIR}/tokenizer/extra.json", b"{}")]


def _remove_file(members: list[Member]) -> list[Member]:
    return [(i, d) for i, d in members if i.name != f"{BUNDLE_DIR}/tokenizer/tokenizer.json"]


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_flip_payload_byte, "hash-mismatch"),
        (_add_file, "extra-file"),
        (_remove_file, "missing-file"),
        (_drop_signature, "unsigned"),
    ],
    ids=["payload-byte-flipped", "file-added", "file-missing", "unsigned"],
)
def test_extract_refuses_a_bundle_the_manifest_does_not_describe(
    signed: tuple[Path, Manifest],
    key: Ed25519PrivateKey,
    tmp_path: Path,
    edit: Callable[[list[Member]], list[Member]],
    reason: str,
) -> None:
    file, _ = signed
    _rewrite(file, edit)
    if reason != "unsigned":
        manifest = verify_release(file, [key.public_key()])  # the manifest itself is intact
    else:
        manifest = read_manifest(file)
    dest = tmp_path / "installed" / "r3"
    _refused(reason, lambda: extract_release(file, manifest, dest))
    _assert_nothing_left(dest)


def test_extract_refuses_a_file_replaced_after_verification(
    export_dir: Path, signed: tuple[Path, Manifest], key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    file, manifest = signed
    _release(export_dir, file, key, release=4)  # swapped between verify and extract
    dest = tmp_path / "dest"
    _refused("corrupt", lambda: extract_release(file, manifest, dest))
    _assert_nothing_left(dest)


def test_extract_refuses_an_existing_destination(
    signed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    file, manifest = signed
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(InputError, match="dest"):
        extract_release(file, manifest, dest)
    assert [p.name for p in dest.iterdir()] == ["keep"]


# --- extraction attacks (hand-crafted tar files) ---


@pytest.mark.parametrize(
    ("attack", "reason"),
    [
        (lambda d: _regular(f"{BUNDLE_DIR}/../../escaped.txt"), "unsafe-path"),
        (lambda d: _regular("../escaped.txt"), "unsafe-path"),
        (lambda d: _regular(str(d / "escaped.txt")), "unsafe-path"),
        (lambda d: _regular(f"{BUNDLE_DIR}/./io_spec.json"), "unsafe-path"),
        (lambda d: _regular("outside.txt"), "unsafe-path"),
        (
            lambda d: _special(f"{BUNDLE_DIR}/link", tarfile.SYMTYPE, "../../escaped.txt"),
            "unsafe-member",
        ),
        (
            lambda d: _special(f"{BUNDLE_DIR}/link", tarfile.SYMTYPE, str(d / "escaped.txt")),
            "unsafe-member",
        ),
        (lambda d: _special(f"{BUNDLE_DIR}/link", tarfile.LNKTYPE, MANIFEST_FILE), "unsafe-member"),
        (lambda d: _special(f"{BUNDLE_DIR}/dev", tarfile.CHRTYPE), "unsafe-member"),
        (lambda d: _special(f"{BUNDLE_DIR}/fifo", tarfile.FIFOTYPE), "unsafe-member"),
        (lambda d: _special("outside", tarfile.DIRTYPE), "unsafe-path"),
    ],
    ids=[
        "dotdot-in-bundle",
        "dotdot",
        "absolute",
        "dot-component",
        "outside-bundle",
        "symlink-relative",
        "symlink-absolute",
        "hardlink",
        "device",
        "fifo",
        "dir-outside-bundle",
    ],
)
def test_extract_refuses_unsafe_members(
    signed: tuple[Path, Manifest],
    tmp_path: Path,
    attack: Callable[[Path], Member],
    reason: str,
) -> None:
    file, manifest = signed
    victim = tmp_path / "victim"
    victim.mkdir()
    # the attack member comes first: nothing of the release is written before it either
    _rewrite(file, lambda members: [attack(victim), *members])
    dest = tmp_path / "installed" / "r3"
    _refused(reason, lambda: extract_release(file, manifest, dest))
    _assert_nothing_left(dest)
    assert not (tmp_path / "escaped.txt").exists() and not list(victim.iterdir())
    assert not (tmp_path / "installed" / "escaped.txt").exists()


def test_a_bundle_file_replaced_by_a_link_is_refused(
    signed: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """The link has a listed name; it is refused for what it is, not merely for its hash."""
    file, manifest = signed
    name = f"{BUNDLE_DIR}/tokenizer/tokenizer.json"

    def swap(members: list[Member]) -> list[Member]:
        return [
            _special(name, tarfile.SYMTYPE, "/etc/passwd") if i.name == name else (i, d)
            for i, d in members
        ]

    dest = tmp_path / "dest"
    _refused("unsafe-member", lambda: extract_release(_rewrite(file, swap), manifest, dest))
    _assert_nothing_left(dest)


TOKENIZER = "tokenizer/tokenizer.json"


def _padded(members: list[Member]) -> list[Member]:
    """The tokenizer padded with 8 MiB of zeros: its tar header says so, its signed size not
    (the issue's 48 MiB member, smaller)."""
    name = f"{BUNDLE_DIR}/{TOKENIZER}"
    return [(i, d + bytes(8 << 20)) if i.name == name else (i, d) for i, d in members]


def _assert_within_declared(staged: dict[str, int], manifest: Manifest) -> None:
    """Each bundle file on disk at the refusal is no larger than its signed size."""
    for path, size in staged.items():
        if path.startswith(f"{BUNDLE_DIR}/"):
            assert size <= manifest.sizes[path.removeprefix(f"{BUNDLE_DIR}/")], (path, size)


def test_a_member_larger_than_its_signed_size_is_refused_before_a_byte_of_it_is_written(
    signed: tuple[Path, Manifest], tmp_path: Path, staged: dict[str, int]
) -> None:
    file, manifest = signed
    _rewrite(file, _padded)
    dest = tmp_path / "dest"
    error = _refused("size-mismatch", lambda: extract_release(file, manifest, dest))
    declared = manifest.sizes[TOKENIZER]
    assert f"'{BUNDLE_DIR}/{TOKENIZER}' is {declared + (8 << 20)} bytes" in str(error)
    assert f"the manifest lists {declared}" in str(error)
    _assert_nothing_left(dest)
    assert staged, "the members before it were written"
    assert f"{BUNDLE_DIR}/{TOKENIZER}" not in staged, "refused on its header, before opening it"
    _assert_within_declared(staged, manifest)


def test_the_copy_stops_at_the_signed_size_when_the_data_runs_past_it(
    signed: tuple[Path, Manifest],
    tmp_path: Path,
    staged: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defence in depth: a tar reader that yields more than the (honest) header says; the copy
    writes the signed size and refuses at the first byte past it."""
    file, manifest = signed
    extractfile = tarfile.TarFile.extractfile

    def longer(self: tarfile.TarFile, member: Any) -> Any:
        data = extractfile(self, member)
        if data is not None and getattr(member, "name", member) == f"{BUNDLE_DIR}/{TOKENIZER}":
            return io.BytesIO(data.read() + bytes(8 << 20))
        return data

    monkeypatch.setattr(tarfile.TarFile, "extractfile", longer)
    dest = tmp_path / "dest"
    error = _refused("size-mismatch", lambda: extract_release(file, manifest, dest))
    assert f"runs past its declared {manifest.sizes[TOKENIZER]} bytes" in str(error)
    _assert_nothing_left(dest)
    assert staged[f"{BUNDLE_DIR}/{TOKENIZER}"] <= manifest.sizes[TOKENIZER]
    _assert_within_declared(staged, manifest)


@pytest.mark.parametrize(
    ("mode", "kind", "pad"), [("w:gz", "gzip", 64 << 20), ("w:bz2", "bzip2", 0), ("w:xz", "xz", 0)]
)
def test_a_compressed_release_is_refused_before_anything_is_written(
    signed: tuple[Path, Manifest],
    key: Ed25519PrivateKey,
    tmp_path: Path,
    staged: dict[str, int],
    mode: str,
    kind: str,
    pad: int,
) -> None:
    """The gzip bomb: 64 MiB of zeros in a member, a few hundred KiB on the wire; also bzip2
    and xz. Refused on its first bytes by every reader: nothing is staged."""
    file, manifest = signed
    name = f"{BUNDLE_DIR}/{TOKENIZER}"
    bomb = tmp_path / "release.tar.compressed"
    with tarfile.open(bomb, mode) as tar:  # type: ignore[call-overload]
        for info, data in _members(file):
            data = data + bytes(pad) if info.name == name else data
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert bomb.stat().st_size < 1 << 20
    dest = tmp_path / "dest"
    for read in (
        lambda: verify_release(bomb, [key.public_key()]),
        lambda: read_manifest(bomb),
        lambda: extract_release(bomb, manifest, dest),
    ):
        error = _refused("bad-format", read)
        assert f"a {kind}-compressed file" in str(error) and "uncompressed tar" in str(error)
    _assert_nothing_left(dest)
    assert staged == {}, "nothing staged"


def test_a_release_over_the_cap_is_refused_before_anything_is_written(
    signed: tuple[Path, Manifest], tmp_path: Path, staged: dict[str, int]
) -> None:
    """The cap bounds the signed sizes and the file itself (whose tar headers and padding the
    sizes do not count)."""
    file, manifest = signed
    declared, size = sum(manifest.sizes.values()), file.stat().st_size
    assert declared < size
    dest = tmp_path / "dest"
    error = _refused(
        "too-large", lambda: extract_release(file, manifest, dest, max_bytes=declared - 1)
    )
    assert (
        f"declares {declared} bytes of bundle files, over this device's cap of {declared - 1} bytes"
        in str(error)
    )
    error = _refused("too-large", lambda: extract_release(file, manifest, dest, max_bytes=declared))
    assert f"the release file is {size} bytes, over this device's cap of {declared}" in str(error)
    _assert_nothing_left(dest)
    assert staged == {}, "nothing staged"
    assert extract_release(file, manifest, dest, max_bytes=size) == dest / BUNDLE_DIR


def test_a_duplicated_member_is_refused(signed: tuple[Path, Manifest], tmp_path: Path) -> None:
    file, manifest = signed
    name = f"{BUNDLE_DIR}/{IO_SPEC_FILE}"
    _rewrite(file, lambda ms: [*ms, _regular(name, b"{}")])
    dest = tmp_path / "dest"
    _refused("unsafe-member", lambda: extract_release(file, manifest, dest))
    _assert_nothing_left(dest)


# --- ONNX external data ---


@pytest.fixture()
def external_export(export_dir: Path, tmp_path: Path) -> Path:
    """A copy of the export bundle whose model keeps its weights in ``policy.onnx.data``."""
    copy = tmp_path / "external-export"
    shutil.copytree(export_dir, copy)
    model = onnx.load(str(copy / ONNX_FILE))  # with its external data, if the export has some
    for extra in copy.glob(f"{ONNX_FILE}?*"):
        extra.unlink()
    onnx.save_model(
        model,
        str(copy / ONNX_FILE),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{ONNX_FILE}.data",
        size_threshold=0,
    )
    assert (copy / f"{ONNX_FILE}.data").is_file()
    return copy


def _set_locations(model_path: Path, location: str) -> None:
    model = onnx.load(str(model_path), load_external_data=False)
    changed = 0
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
                changed += 1
    assert changed
    model_path.write_bytes(model.SerializeToString())


def test_a_model_with_external_data_inside_its_bundle_is_accepted(
    external_export: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    file = tmp_path / "release.tar"
    manifest = _release(external_export, file, key)
    assert f"{ONNX_FILE}.data" in manifest.files
    bundle = extract_release(file, verify_release(file, [key.public_key()]), tmp_path / "dest")
    onnx.checker.check_model(onnx.load(str(bundle / ONNX_FILE)))


@pytest.mark.parametrize(
    "location",
    [
        "../secret.bin",
        "../../secret.bin",
        "tokenizer/../../secret.bin",
        "/etc/passwd",
        "unlisted.bin",
        "*/_ORT_MEM_ADDR_/*",
    ],
)
def test_external_data_outside_the_bundle_is_refused(
    external_export: Path, key: Ed25519PrivateKey, tmp_path: Path, location: str
) -> None:
    """Signed by a trusted key (a compromised build), still refused on the device."""
    _set_locations(external_export / ONNX_FILE, location)
    installed = tmp_path / "installed"
    installed.mkdir()
    (installed / "secret.bin").write_bytes(b"secret" * 100)
    (tmp_path / "secret.bin").write_bytes(b"secret" * 100)
    file = tmp_path / "release.tar"
    manifest = _release(external_export, file, key)
    verify_release(file, [key.public_key()])
    dest = installed / "r3"
    error = _refused("external-data-outside", lambda: extract_release(file, manifest, dest))
    assert repr(location) in str(error)
    _assert_nothing_left(dest)


def test_external_data_in_a_subgraph_attribute_is_found(
    export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """A tensor hidden in a Constant node inside an If branch, not an initializer."""
    copy = tmp_path / "export"
    shutil.copytree(export_dir, copy)
    value = onnx.helper.make_tensor("hidden", onnx.TensorProto.FLOAT, [1], [0.0])
    value.ClearField("float_data")
    value.data_location = onnx.TensorProto.EXTERNAL
    value.external_data.add(key="location", value="../secret.bin")
    branch = onnx.helper.make_graph(
        [onnx.helper.make_node("Constant", [], ["y"], value=value)],
        "branch",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
        "g",
        [onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    (copy / ONNX_FILE).write_bytes(onnx.helper.make_model(graph).SerializeToString())
    file = tmp_path / "release.tar"
    manifest = _release(copy, file, key)
    dest = tmp_path / "dest"
    _refused("external-data-outside", lambda: extract_release(file, manifest, dest))
    _assert_nothing_left(dest)


# --- policy: expiry and downgrade ---


def test_expiry_is_refused_unless_forced(signed: tuple[Path, Manifest]) -> None:
    _, manifest = signed
    assert check_policy(manifest, floor=None, now=NOW + timedelta(days=29)) == []
    later = NOW + timedelta(days=31)
    error = _refused("expired", lambda: check_policy(manifest, floor=None, now=later))
    assert "2026-05-31T12:00:00Z" in str(error)
    assert check_policy(manifest, floor=None, now=later, force=True) == ["expired"]
    naive_later = later.replace(tzinfo=None)
    _refused("expired", lambda: check_policy(manifest, floor=None, now=naive_later))


def test_downgrade_is_refused_unless_forced(signed: tuple[Path, Manifest]) -> None:
    _, manifest = signed
    assert manifest.release == 3
    error = _refused("downgrade", lambda: check_policy(manifest, floor=4, now=NOW))
    assert "4" in str(error)
    assert check_policy(manifest, floor=4, now=NOW, force=True) == ["downgrade"]
    later = NOW + timedelta(days=31)
    both = check_policy(manifest, floor=4, now=later, force=True)
    assert both == ["expired", "downgrade"]
    _refused("expired", lambda: check_policy(manifest, floor=4, now=later))


def test_write_release_refuses_bad_arguments(
    export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    for options in ({"release": -1}, {"expires_in_days": 0}, {"budget_ms": -5.0}):
        with pytest.raises(InputError):
            _release(export_dir, tmp_path / "r.tar", key, **options)
    assert not os.listdir(tmp_path)


def test_a_variants_external_data_is_checked_like_the_models(
    export_dir: Path, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """A precision variant with its own external data (``policy.int8.onnx.data``) travels and
    is accepted; one whose data lies outside the bundle is refused as the model's would be."""
    from tests.deploy_edge.variants import with_variants

    bundle = with_variants(export_dir, tmp_path / "variants", {"name": "int8", "file": "copy"})
    variant = bundle / "policy.int8.onnx"
    onnx.save_model(
        onnx.load(str(variant)),
        str(variant),
        save_as_external_data=True,
        location="policy.int8.onnx.data",
        size_threshold=0,
    )
    write_bundle_checksums(bundle)
    file = tmp_path / "ok.release"
    manifest = _release(bundle, file, key)
    assert {"policy.int8.onnx", "policy.int8.onnx.data"} <= set(manifest.files)
    extracted = extract_release(file, manifest, tmp_path / "ok")
    assert (extracted / "policy.int8.onnx.data").is_file()

    _set_locations(variant, "../secret.bin")
    write_bundle_checksums(bundle)
    (tmp_path / "secret.bin").write_bytes(b"secret" * 100)
    file = tmp_path / "bad.release"
    manifest = _release(bundle, file, key)
    error = _refused(
        "external-data-outside", lambda: extract_release(file, manifest, tmp_path / "bad")
    )
    assert "policy.int8.onnx: tensor" in str(error) and "'../secret.bin'" in str(error)
    _assert_nothing_left(tmp_path / "bad")
