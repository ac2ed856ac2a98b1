"""Pieces of a release file: what a delta upload sends, and what a device already holds.

A release is an uncompressed tar (:mod:`deploy_edge.release`), so each bundle file's bytes lie
whole and in order inside it. A **piece** is a run of the release's bytes named by its sha256:

- each bundle member's data is cut into blocks of :data:`PIECE_BYTES`, counted from the
  member's first byte (the last block of a file is shorter);
- the bytes between them (tar headers, the manifest and signature members, padding, the
  end-of-archive blocks) are pieces of their own, a few KiB in all.

A device holds the same blocks of every bundle file it keeps in a slot (:func:`file_pieces`,
cut the same way from each file's first byte), so an unchanged run of a file gives the same
pieces in the old release and the new one. A delta upload sends only the pieces the device
lacks, and the device assembles the release file from what it holds plus what arrived; the
assembled file must hash to the release's sha256 and is then verified whole as any upload
(signature, sizes, hashes), so a delta can never install what the full upload would not.

**Why blocks at fixed offsets of each file**, not one piece per file nor content-defined
chunks: a LoRA fine-tune changes some tensors of the merged weights, which live in one large
external-data file, so whole files would resend it all. An export of the same architecture
writes its tensors in the same order at the same offsets (their shapes fix the layout), so a
changed tensor changes only the blocks it overlaps: at 1 MiB, a tensor of a few MiB wastes at
most a block on each side. Content-defined chunks would also survive bytes inserted or removed
mid-file, which exports of one model never do, at the cost of a rolling hash over GiBs; a new
architecture changes most tensors anyway.

Standard library only: the device runs it.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from deploy_edge.release.header import BUNDLE_DIR

PIECE_BYTES = 1 << 20
"""The block a bundle file is cut into, bytes (the last block of a file is shorter). A device
and a client must cut alike: the device's ``GET /pieces`` says the size it uses."""
MAX_PIECE_BYTES = PIECE_BYTES
"""The largest piece either side makes or accepts (the bytes between two bundle blocks are cut
at this size too)."""


@dataclass(frozen=True)
class Piece:
    """``size`` bytes at ``offset`` of a file, whose sha256 is ``sha256``."""

    sha256: str
    offset: int
    size: int


def release_pieces(release: Path) -> list[Piece]:
    """The release file ``release`` cut into pieces, in file order, covering every byte once
    (see the module docstring): bundle members' data in :data:`PIECE_BYTES` blocks from each
    member's first byte, everything between as pieces of at most :data:`MAX_PIECE_BYTES`."""
    with tarfile.open(release, mode="r:") as tar:
        data_runs = [
            (member.offset_data, member.size)
            for member in tar.getmembers()
            if member.isfile() and member.name.startswith(f"{BUNDLE_DIR}/") and member.size
        ]
    total = release.stat().st_size
    spans: list[tuple[int, int]] = []  # (offset, size), every byte of the file once
    at = 0
    for start, size in sorted(data_runs):
        spans += _cut(at, start - at)  # headers, padding and metadata members before it
        spans += _cut(start, size)
        at = start + size
    spans += _cut(at, total - at)
    with release.open("rb") as f:
        return [Piece(_sha(f, offset, size), offset, size) for offset, size in spans]


def file_pieces(path: Path) -> Iterator[Piece]:
    """The blocks of one bundle file as a device holds it: :data:`PIECE_BYTES` from its first
    byte (offsets in the file)."""
    with path.open("rb") as f:
        for offset, size in _cut(0, path.stat().st_size):
            yield Piece(_sha(f, offset, size), offset, size)


def _cut(start: int, size: int) -> list[tuple[int, int]]:
    """``size`` bytes from ``start`` as (offset, size) blocks of at most PIECE_BYTES."""
    end = start + size
    return [(o, min(PIECE_BYTES, end - o)) for o in range(start, end, PIECE_BYTES)]


def _sha(f: BinaryIO, offset: int, size: int) -> str:
    f.seek(offset)
    return hashlib.sha256(f.read(size)).hexdigest()
