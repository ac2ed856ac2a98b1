"""A release's payload: extracting the bundle, every member checked before it is written.

:func:`extract_release` unpacks a verified release into a fresh directory, accepting only
regular files inside ``bundle/`` whose sha256 and size the manifest lists (PEP 706's ``data``
filter plus checks of its own), none missing and none extra, and graphs whose external data
stays inside the bundle (:mod:`deploy_edge.bundle.external_data`). What it writes is bounded by
the signed sizes: a member whose tar header says otherwise is refused before a byte of it is
written, the copy stops at the declared size, and the sizes must add up to no more than the
device's cap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from deploy_edge.bundle.external_data import ExternalDataError, check_external_data
from deploy_edge.bundle.io_spec import IOSpecError, read_io_spec
from deploy_edge.release.header import (
    BUNDLE_DIR,
    MANIFEST_FILE,
    MAX_METADATA_BYTES,
    SIGNATURE_FILE,
    Reason,
    ReleaseError,
    open_tar,
    refuse_compressed,
    safe_parts,
)
from deploy_edge.release.manifest import Manifest, check_listed_paths, signed_bytes
from robo_pipe.errors import InputError
from robo_pipe.records import RecordError

_CHUNK = 1 << 20


def extract_release(
    file: Path, manifest: Manifest, dest: Path, *, max_bytes: int | None = None
) -> Path:
    """Unpack the release ``file``, whose verified manifest is ``manifest``, into the new
    directory ``dest`` and return the bundle directory in it (``dest/bundle``, which
    :func:`deploy_edge.bundle.io_spec.read_io_spec` reads); ``dest`` also receives
    ``manifest.json`` and ``manifest.sig``, so that the installed release can be verified again.

    ``max_bytes``: the most this release may take, bytes (a device's ``max_release_mb``); both
    the release file and the sum of the manifest's ``sizes`` must be within it. None: no cap
    (a workstation checking its own release).

    Unpacks into a staging directory beside ``dest`` and renames it into place once every check
    passed; on a refusal neither is left. At most the manifest's ``sizes`` are ever written (plus
    the two manifest members, each at most 16 MiB). Refuses with :class:`ReleaseError`:

    - ``too-large``: the release file or its declared sizes exceed ``max_bytes`` (before
      anything is written);
    - ``size-mismatch``: a bundle member whose tar header size is not the manifest's (before a
      byte of it is written), or whose data runs past that size (the copy stops there);

    - ``unsafe-path``: a member with an absolute path, a ``..`` or ``.`` component, an empty
      component or a backslash, or outside ``bundle/`` (other than the two manifest members);
    - ``unsafe-member``: a member that is not a regular file or directory (symlinks, hard links,
      devices, fifos, sparse files) or appears twice;
    - ``extra-file`` / ``missing-file``: a bundle file the manifest does not list / a listed one
      the file lacks; ``hash-mismatch``: a bundle file whose sha256 is not the listed one;
    - ``external-data-outside``: the model (the spec's ``onnx_file``) or a precision variant
      (its ``variants``' files) reads external data from a location that is not a file of the
      bundle the manifest lists;
    - ``corrupt``: an unreadable archive, a ``manifest.json`` other than ``manifest``, a bundle
      whose ``io_spec.json`` differs from the manifest's; ``bad-format`` / ``unsigned``: no
      manifest / signature member, or a compressed file (before anything is written).

    ``dest`` must not exist (:class:`InputError`); its parent is created if missing.
    """
    target = Path(dest)
    if target.exists() or target.is_symlink():
        raise InputError(f"{target}: already exists (extract a release into a new directory)")
    check_listed_paths(file, manifest)
    _check_size(file, manifest, max_bytes)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    try:
        _extract_into(file, manifest, staging)
        bundle = staging / BUNDLE_DIR
        _check_external_data(file, manifest, bundle)
        try:
            spec = read_io_spec(bundle)
        except IOSpecError as err:
            raise ReleaseError("corrupt", f"{file}: the bundle's I/O spec: {err}") from err
        if spec != manifest.io_spec:
            raise ReleaseError(
                "corrupt", f"{file}: the bundle's io_spec.json differs from the manifest's io_spec"
            )
        staging.chmod(0o755)
        if target.exists() or target.is_symlink():
            raise InputError(f"{target}: appeared while the release was extracted")
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target / BUNDLE_DIR


def _check_size(file: Path, manifest: Manifest, max_bytes: int | None) -> None:
    """``too-large`` when the release file or the sum of its declared sizes is over
    ``max_bytes`` (None: no cap); checked before anything is written."""
    refuse_compressed(file)
    if max_bytes is None:
        return
    cap = f"this device's cap of {max_bytes} bytes ({max_bytes / (1 << 20):.1f} MiB)"
    declared = sum(manifest.sizes.values())
    if declared > max_bytes:
        raise ReleaseError(
            "too-large",
            f"{file}: its manifest declares {declared} bytes of bundle files, over {cap}",
        )
    size = Path(file).stat().st_size
    if size > max_bytes:
        raise ReleaseError("too-large", f"{file}: the release file is {size} bytes, over {cap}")


def _extract_into(file: Path, manifest: Manifest, staging: Path) -> None:
    """Unpack ``file`` into the empty directory ``staging``, checking every member."""
    seen: set[str] = set()
    found: set[str] = set()
    with open_tar(file) as tar:
        for member in tar:
            name = member.name
            parts = safe_parts(file, name, "member")
            if name in seen:
                raise ReleaseError("unsafe-member", f"{file}: member {name!r} appears twice")
            seen.add(name)
            kind = "directory" if member.isdir() else "file"
            if member.isdir():
                if parts[0] != BUNDLE_DIR:
                    raise ReleaseError(
                        "unsafe-path", f"{file}: member {name!r}: a directory outside {BUNDLE_DIR}/"
                    )
            elif member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                raise ReleaseError(
                    "unsafe-member",
                    f"{file}: member {name!r}: a {_kind(member)}, only regular files are allowed",
                )
            elif name in (MANIFEST_FILE, SIGNATURE_FILE):
                pass
            elif parts[0] != BUNDLE_DIR or len(parts) < 2:
                raise ReleaseError("unsafe-path", f"{file}: member {name!r}: outside {BUNDLE_DIR}/")
            elif "/".join(parts[1:]) not in manifest.files:
                raise ReleaseError(
                    "extra-file",
                    f"{file}: member {name!r}: a bundle file the manifest does not list",
                )
            try:  # PEP 706: the standard library's own judgement, as a second line
                tarfile.data_filter(member, str(staging))
            except tarfile.FilterError as err:
                reason: Reason = (
                    "unsafe-path"
                    if isinstance(err, tarfile.AbsolutePathError | tarfile.OutsideDestinationError)
                    else "unsafe-member"
                )
                raise ReleaseError(reason, f"{file}: member {name!r}: {err}") from err
            limit = _member_limit(file, manifest, member, parts)
            path = staging.joinpath(*parts)
            try:
                if member.isdir():
                    path.mkdir(mode=0o755, parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                digest = _write_member(tar, member, path, limit, f"{file}: member {name!r}")
            except OSError as err:
                raise ReleaseError(
                    "unsafe-member", f"{file}: member {name!r}: cannot write this {kind} ({err})"
                ) from err
            if name == MANIFEST_FILE:
                if path.read_bytes() != signed_bytes(manifest) and _reparsed(path) != manifest:
                    raise ReleaseError(
                        "corrupt",
                        f"{file}: its {MANIFEST_FILE} is not the manifest given "
                        "(was the file replaced after it was verified?)",
                    )
            elif name != SIGNATURE_FILE:
                rel = "/".join(parts[1:])
                if digest != manifest.files[rel]:
                    raise ReleaseError(
                        "hash-mismatch",
                        f"{file}: bundle file {rel!r} has sha256 {digest}, "
                        f"the manifest lists {manifest.files[rel]}",
                    )
                found.add(rel)
    if MANIFEST_FILE not in seen:
        raise ReleaseError("bad-format", f"{file}: not a robo-pipe release (no {MANIFEST_FILE})")
    if SIGNATURE_FILE not in seen:
        raise ReleaseError("unsigned", f"{file}: unsigned release (no {SIGNATURE_FILE})")
    missing = sorted(set(manifest.files) - found)
    if missing:
        raise ReleaseError(
            "missing-file",
            f"{file}: bundle file{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
            "listed in the manifest but not in the release",
        )


def _member_limit(
    file: Path, manifest: Manifest, member: tarfile.TarInfo, parts: tuple[str, ...]
) -> int:
    """The most bytes the regular file ``member`` may write, bytes: a bundle file's signed size
    (``size-mismatch`` when its tar header says otherwise, before a byte is written), at most
    16 MiB for the manifest and its signature. 0 for a directory."""
    if member.isdir():
        return 0
    name = member.name
    if name in (MANIFEST_FILE, SIGNATURE_FILE):
        if member.size > MAX_METADATA_BYTES:
            raise ReleaseError(
                "corrupt", f"{file}: member {name!r} is {member.size} bytes (too large)"
            )
        return member.size
    rel = "/".join(parts[1:])
    if member.size != manifest.sizes[rel]:
        raise ReleaseError(
            "size-mismatch",
            f"{file}: member {name!r} is {member.size} bytes in the archive, the manifest lists "
            f"{manifest.sizes[rel]}",
        )
    return manifest.sizes[rel]


def _write_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path, limit: int, where: str
) -> str:
    """Copy a regular file member to the new file ``path``, writing at most ``limit`` bytes
    (``size-mismatch`` at the first byte past it, which is not written); returns the sha256 of
    the bytes written. The header was checked against ``limit`` already: this is the second
    line, should a reader ever yield more than its header says."""
    source = tar.extractfile(member)
    assert source is not None  # a regular file
    digest = hashlib.sha256()
    written = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with source, os.fdopen(os.open(path, flags, 0o644), "wb") as out:
        # one byte more than is left, so that an excess is seen without being written
        while chunk := source.read(min(_CHUNK, limit - written + 1)):
            if written + len(chunk) > limit:
                raise ReleaseError(
                    "size-mismatch", f"{where}: runs past its declared {limit} bytes"
                )
            digest.update(chunk)
            out.write(chunk)
            written += len(chunk)
    return digest.hexdigest()


def _reparsed(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(json.loads(path.read_bytes()))
    except (ValueError, RecordError):
        return None


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"hard link to {member.linkname!r}"
    if member.ischr() or member.isblk():
        return "device"
    if member.isfifo():
        return "fifo"
    if member.issparse():
        return "sparse file"
    return f"member of tar type {member.type!r}"


def _check_external_data(file: Path, manifest: Manifest, bundle: Path) -> None:
    """Every external data location of the model, of each precision variant and of the
    instruction graph is a file of the bundle the manifest lists (relative to the model's
    directory, as ONNX resolves it)."""
    try:
        check_external_data(bundle, manifest.io_spec, manifest.files)
    except ExternalDataError as err:
        raise ReleaseError("external-data-outside", f"{file}: {err}") from err
    except IOSpecError as err:
        raise ReleaseError("corrupt", f"{file}: {err}") from err
