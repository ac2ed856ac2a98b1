"""The kernel's checksums (robo_pipe.integrity) and its out-of-space error (robo_pipe.errors)."""

from __future__ import annotations

import errno
import hashlib
import json
import pickle
from pathlib import Path

import pytest

import robo_pipe.integrity
from robo_pipe.errors import OutOfSpaceError, RoboPipeError, out_of_space_errno
from robo_pipe.integrity import (
    CHECKSUMS_FILE,
    FileSum,
    IntegrityError,
    file_sha256,
    file_sums,
    read_checksums,
    tree_sha256,
    verify_checksums,
    write_checksums,
    writing,
)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A directory of three files with its checksums."""
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(bytes(range(256)) * 40)
    (root / "b.txt").write_text("hello")
    (root / "sub" / "c.json").write_text("{}")
    write_checksums(root, file_sums(root, files(root)))
    return root


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE)


def record_hashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files hashed from now on, in order."""
    hashed: list[str] = []
    real = robo_pipe.integrity.file_sha256

    def recording(path: str | Path) -> str:
        hashed.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(robo_pipe.integrity, "file_sha256", recording)
    return hashed


def test_file_sha256_streams_the_bytes(tree: Path) -> None:
    data = (tree / "a.bin").read_bytes()
    assert file_sha256(tree / "a.bin") == hashlib.sha256(data).hexdigest()


def test_written_checksums_verify_and_say_what_they_cover(tree: Path) -> None:
    manifest = json.loads((tree / CHECKSUMS_FILE).read_text())
    assert manifest["format"] == "robo-pipe-checksums/1"
    assert manifest["files"]["sub/c.json"] == {
        "size": 2,
        "sha256": file_sha256(tree / "sub/c.json"),
    }
    sums = verify_checksums(tree, files(tree))
    assert sums == read_checksums(tree) and set(sums) == {"a.bin", "b.txt", "sub/c.json"}
    assert sums["b.txt"] == FileSum(5, hashlib.sha256(b"hello").hexdigest())
    assert not list(tree.glob(".*tmp*")), "written beside, then renamed"


def test_a_flipped_byte_fails_the_sha256_check(tree: Path) -> None:
    data = bytearray((tree / "a.bin").read_bytes())
    data[100] ^= 0x01
    (tree / "a.bin").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"a\.bin: sha256 check failed.*; fix it so") as err:
        verify_checksums(tree, files(tree), fix="fix it so")
    assert (err.value.path, err.value.check) == (tree / "a.bin", "sha256")
    assert isinstance(err.value, RoboPipeError) and isinstance(err.value, ValueError)


def test_a_truncated_file_fails_the_size_check_without_hashing(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tree / "a.bin").write_bytes(b"short")
    hashed = record_hashing(monkeypatch)
    with pytest.raises(IntegrityError, match=r"a\.bin: size check failed: 5 bytes") as err:
        verify_checksums(tree, files(tree))
    assert err.value.check == "size" and hashed == []


def test_missing_unlisted_and_every_problem_on_its_own_line(tree: Path) -> None:
    (tree / "b.txt").unlink()
    (tree / "sub" / "new.txt").write_text("added")
    with pytest.raises(IntegrityError) as err:
        verify_checksums(tree, files(tree))
    lines = str(err.value).splitlines()
    assert lines == [
        f"{tree / 'b.txt'}: missing check failed: listed in checksums.json but not there",
        f"{tree / 'sub/new.txt'}: unlisted check failed: there but not listed in checksums.json "
        "(added since)",
    ]
    assert (err.value.path, err.value.check) == (tree / "b.txt", "missing")


def test_only_checks_the_files_asked_for_and_the_whole_listing(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = record_hashing(monkeypatch)
    (tree / "sub" / "c.json").write_text("{ }")  # changed, but not asked for
    assert set(verify_checksums(tree, files(tree), only=["b.txt"])) == {"b.txt"}
    assert hashed == ["b.txt"]
    with pytest.raises(IntegrityError, match=r"c\.json: size check failed"):
        verify_checksums(tree, files(tree), only=["sub/c.json"])
    (tree / "b.txt").unlink()
    with pytest.raises(IntegrityError, match=r"b\.txt: missing check failed"):
        verify_checksums(tree, files(tree), only=["a.bin"])


def test_no_or_a_bad_manifest_is_refused(tree: Path) -> None:
    (tree / CHECKSUMS_FILE).write_text('{"format": "robo-pipe-checksums/1", "files": {"../x": {}}}')
    with pytest.raises(IntegrityError, match=r"checksums check failed: unreadable.*not a path"):
        verify_checksums(tree, files(tree))
    (tree / CHECKSUMS_FILE).write_text('{"format": "other/9", "files": {}}')
    with pytest.raises(IntegrityError, match="format 'other/9'"):
        verify_checksums(tree, files(tree))
    (tree / CHECKSUMS_FILE).unlink()
    with pytest.raises(IntegrityError, match=r"no checksums recorded.*; re-run it") as err:
        verify_checksums(tree, files(tree), fix="re-run it")
    assert (err.value.path, err.value.check) == (tree / CHECKSUMS_FILE, "checksums")


def test_errors_cross_process_boundaries_whole() -> None:
    integrity = pickle.loads(pickle.dumps(IntegrityError("/x/y", "sha256", "/x/y: bad")))
    assert (integrity.path, integrity.check, str(integrity)) == (
        Path("/x/y"),
        "sha256",
        "/x/y: bad",
    )
    full = pickle.loads(pickle.dumps(OutOfSpaceError.writing(errno.EFBIG, "/o/f", "/o", "kept")))
    assert full.errno == errno.EFBIG and str(full).startswith("/o/f: the disk is full (File too")


def test_tree_sha256_is_over_paths_and_digests_in_order() -> None:
    pairs = [("a", "1" * 64), ("b", "2" * 64)]
    assert tree_sha256(pairs) == hashlib.sha256(b"a\0" + b"1" * 64 + b"b\0" + b"2" * 64).hexdigest()
    assert tree_sha256(pairs) != tree_sha256(pairs[::-1])


def test_out_of_space_is_recognised_through_causes_and_rust_messages() -> None:
    assert out_of_space_errno(OSError(errno.ENOSPC, "full")) == errno.ENOSPC
    assert out_of_space_errno(OSError(errno.EACCES, "denied")) is None
    rust = RuntimeError("Error while serializing: I/O error: File too large (os error 27)")
    assert out_of_space_errno(rust) == errno.EFBIG
    try:
        try:
            raise OSError(errno.EDQUOT, "quota")
        except OSError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert out_of_space_errno(outer) == errno.EDQUOT


def test_writing_removes_its_temporary_output_and_names_a_full_disk(tmp_path: Path) -> None:
    out, tmp = tmp_path / "out", tmp_path / ".out.partial"
    out.mkdir()
    (out / "done").write_text("the previous complete output")
    full = r"out: the disk is full.*out is untouched.*resumes"
    with pytest.raises(OutOfSpaceError, match=full), writing(out, tmp, kept="out is untouched"):
        tmp.mkdir()
        (tmp / "half").write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not tmp.exists() and (out / "done").read_text() == "the previous complete output"
    with pytest.raises(KeyError), writing(out, tmp):  # any other failure: cleaned up, re-raised
        tmp.write_text("partial")
        raise KeyError("bug")
    assert not tmp.exists()
