"""A release file's header: what the file is, its members, and how a refusal is reported.

The format's name and version (:data:`RELEASE_FORMAT`, :data:`RELEASE_FORMAT_VERSION`, which
:func:`deploy_edge.release.manifest.parse_manifest` holds a manifest to), the member names, the
refusal reasons (:class:`ReleaseError`), and reading the tar: compressed files refused
(:func:`refuse_compressed`), the manifest and signature members found once each and read
within :data:`MAX_METADATA_BYTES`, member paths held plain (:func:`safe_parts`). Standard
library only.
"""

from __future__ import annotations

import contextlib
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal, get_args

from deploy_edge.bundle.layout import relative_parts
from robo_pipe.errors import RoboPipeError

RELEASE_FORMAT = "robo-pipe-release"
"""The manifest's ``format``: what kind of file this is."""
RELEASE_FORMAT_VERSION = 3
"""The manifest ``format_version`` this robo-pipe writes and reads (2: ``sizes``, every bundle
file's size, signed; 3: ``gated_target`` and ``gated_inference_ms``, the figure a device holds
its own inference to, which a reader of 2 would not enforce). Older ones are refused with a
hint to sign the release again."""
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
BUNDLE_DIR = "bundle"
"""The tar directory (and the directory :func:`deploy_edge.release.payload.extract_release`
returns) holding the bundle."""

SIGNATURE_ALGORITHM = "ed25519"

Reason = Literal[
    "no-trusted-keys",
    "unsigned",
    "untrusted-key",
    "bad-signature",
    "bad-format",
    "hash-mismatch",
    "missing-file",
    "extra-file",
    "unsafe-path",
    "unsafe-member",
    "external-data-outside",
    "expired",
    "downgrade",
    "corrupt",
    "too-large",
    "size-mismatch",
]
REASONS: Final = frozenset(get_args(Reason))
"""Every :attr:`ReleaseError.reason`."""

MAX_METADATA_BYTES = 16 << 20
"""Largest manifest.json / manifest.sig read into memory, bytes."""
_COMPRESSED: Final = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
"""The magic bytes a compressed file starts with -> its compression (for the refusal's message;
the tar is opened ``r:``, which never decompresses)."""


class ReleaseError(RoboPipeError, ValueError):
    """A release is refused. ``reason`` is a short machine-readable code (one of
    :data:`REASONS`): ``no-trusted-keys``, ``unsigned``, ``untrusted-key``, ``bad-signature``,
    ``bad-format``, ``hash-mismatch``, ``missing-file``, ``extra-file``, ``unsafe-path``,
    ``unsafe-member``, ``external-data-outside``, ``expired``, ``downgrade``, ``corrupt``,
    ``too-large``, ``size-mismatch``; the message is for people and names the file, member or
    value at fault."""

    def __init__(self, reason: Reason, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown release refusal reason {reason!r}")  # a bug in the caller
        super().__init__(message)
        self.reason: str = reason


@contextlib.contextmanager
def open_tar(file: Path) -> Iterator[tarfile.TarFile]:
    """The release ``file`` open as an uncompressed tar; ``corrupt`` when it cannot be read
    (then or while the caller reads it), ``bad-format`` when it is compressed."""
    refuse_compressed(file)
    try:
        tar = tarfile.open(file, "r:")  # noqa: SIM115  # closed by the `with tar` below
    except FileNotFoundError as err:
        raise ReleaseError("corrupt", f"{file}: no such release file") from err
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ReleaseError("corrupt", f"{file}: not a readable release file ({err})") from err
    try:
        with tar:
            yield tar
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise ReleaseError("corrupt", f"{file}: unreadable archive ({err})") from err


def refuse_compressed(file: Path) -> None:
    """``bad-format`` for a gzip, bzip2 or xz file: only an uncompressed release's own size
    bounds what it unpacks to (a 373 KiB gzip release unpacked to 256 MiB)."""
    try:
        with Path(file).open("rb") as raw:
            head = raw.read(8)
    except FileNotFoundError as err:
        raise ReleaseError("corrupt", f"{file}: no such release file") from err
    except OSError as err:
        raise ReleaseError("corrupt", f"{file}: not a readable release file ({err})") from err
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise ReleaseError(
                "bad-format",
                f"{file}: a {kind}-compressed file; a release is an uncompressed tar file (as "
                "robo-pipe bundle writes it), whose size bounds what it unpacks to",
            )


def metadata_members(file: Path, tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """The manifest and signature members of ``tar`` by name (each must be unique)."""
    found: dict[str, tarfile.TarInfo] = {}
    for member in tar:
        if member.name in (MANIFEST_FILE, SIGNATURE_FILE):
            if member.name in found:
                raise ReleaseError("corrupt", f"{file}: member {member.name!r} appears twice")
            found[member.name] = member
    return found


def read_metadata(
    file: Path, tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str
) -> bytes | None:
    """The bytes of the metadata member ``name`` (of those :func:`metadata_members` found);
    None when there is none. ``unsafe-member`` unless a regular file, ``corrupt`` when over
    :data:`MAX_METADATA_BYTES`."""
    member = members.get(name)
    if member is None:
        return None
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise ReleaseError("unsafe-member", f"{file}: member {name!r} is not a regular file")
    if member.size > MAX_METADATA_BYTES:
        raise ReleaseError("corrupt", f"{file}: member {name!r} is {member.size} bytes (too large)")
    data = tar.extractfile(member)
    assert data is not None  # a regular file
    return data.read()


def safe_parts(file: Path, name: str, what: str) -> tuple[str, ...]:
    """The components of the relative POSIX path ``name``; ``unsafe-path`` unless it is plain:
    not absolute, no empty, ``.`` or ``..`` component, no backslash or NUL."""
    try:
        return relative_parts(name)
    except ValueError as err:
        raise ReleaseError("unsafe-path", f"{file}: {what} {name!r}: {err}") from err
