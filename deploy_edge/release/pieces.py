"""Pieces of a release file: what a delta upload sends, and what a device already holds.

A release is an uncompressed tar (:mod:`deploy_edge.release`), so each bundle file's bytes lie
whole and in order inside it. A **piece** is a run of the release's bytes named by its sha256:

- each bundle file is cut where a tensor of one of the bundle's graphs begins in it (the
  external data of ``policy.onnx``, of a precision variant), and every run between two cuts
  into blocks of :data:`PIECE_BYTES` counted from the run's first byte (a file no graph reads
  is one run: blocks from its first byte);
- the bytes between bundle files (tar headers, the manifest and signature members, padding,
  the end-of-archive blocks) are pieces of their own, a few KiB in all.

A device cuts the bundle files it keeps in its slots the same way (:func:`bundle_pieces`), so
an unchanged tensor gives the same pieces in the old release and the new one. A delta upload
sends only the pieces the device lacks, and the device assembles the release file from what it
holds plus what arrived; the assembled file must hash to the release's sha256 and is then
verified whole as any upload (signature, sizes, hashes), so a delta can never install what the
full upload would not.

**Why one piece per tensor** (big tensors in blocks): a fine-tune changes some tensors of the
weights, which live in one large external-data file, so whole files would resend it all. Fixed
blocks of the file would resend every block a changed tensor touches: with LoRA adapters kept
beside the base weights (``export.lora: separate``), each adapter is a few KiB sitting between
base matrices: at the 256M preset, 1 MiB blocks of the files sent 24% of a second fine-tune's
release, cut at the tensors 1.3% (its adapters, heads and graphs). An unchanged tensor is an
unchanged piece wherever the export put it.
Content-defined chunking would find the same boundaries without reading the graph, at the cost
of a rolling hash over GiBs.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from deploy_edge.bundle.external_data import tensor_starts
from deploy_edge.release.header import BUNDLE_DIR

PIECE_BYTES = 1 << 20
"""The block a run of a bundle file is cut into, bytes (the last block of a run is shorter). A
device and a client must cut alike: a client of another size finds no piece held and sends
them all."""
MAX_PIECE_BYTES = PIECE_BYTES
"""The largest piece either side makes or accepts (the bytes between two bundle blocks are cut
at this size too)."""
BATCH_BYTES = 4 * MAX_PIECE_BYTES
"""Bytes of pieces a client sends in one ``PUT /pieces`` (a fine-tune's adapters are hundreds
of pieces of a few KiB: one request each would cost more than their bytes)."""
MAX_BATCH_BYTES = 8 * MAX_PIECE_BYTES
"""The most a ``PUT /pieces`` body may be, bytes, its header line included."""


@dataclass(frozen=True)
class Piece:
    """``size`` bytes at ``offset`` of a file, whose sha256 is ``sha256``."""

    sha256: str
    offset: int
    size: int


def release_pieces(release: Path) -> list[Piece]:
    """The release file ``release`` cut into pieces, in file order, covering every byte once
    (see the module docstring)."""
    prefix = f"{BUNDLE_DIR}/"
    with tarfile.open(release, mode="r:") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)]
        graphs = {}
        for member in members:
            reader = tar.extractfile(member) if member.name.endswith(".onnx") else None
            if reader is not None:
                graphs[member.name.removeprefix(prefix)] = reader.read()
    starts = tensor_starts(graphs)
    spans: list[tuple[int, int]] = []  # (offset, size), every byte of the file once
    at = 0
    for member in sorted(members, key=lambda m: m.offset_data):
        spans += _cut(at, member.offset_data - at)  # headers, padding, metadata members
        runs = _runs(member.size, starts.get(member.name.removeprefix(prefix), ()))
        spans += [(member.offset_data + offset, size) for offset, size in runs]
        at = member.offset_data + member.size
    spans += _cut(at, release.stat().st_size - at)
    with release.open("rb") as f:
        return [Piece(_sha(f, offset, size), offset, size) for offset, size in spans]


def bundle_pieces(bundle: Path) -> Iterator[tuple[Path, Piece]]:
    """The pieces of every file under ``bundle`` (a slot's bundle directory), cut as a release
    cuts them (offsets in each file)."""
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    graphs = [f for f in files if f.suffix == ".onnx"]
    starts = tensor_starts({f.relative_to(bundle).as_posix(): f.read_bytes() for f in graphs})
    for path in files:
        cuts = starts.get(path.relative_to(bundle).as_posix(), ())
        with path.open("rb") as f:
            for offset, size in _runs(path.stat().st_size, cuts):
                yield path, Piece(_sha(f, offset, size), offset, size)


def _runs(size: int, starts: Iterable[int]) -> list[tuple[int, int]]:
    """A file of ``size`` bytes cut at ``starts`` (tensors' first bytes), each run in blocks."""
    cuts = sorted({0, *(s for s in starts if 0 < s < size)})
    ends = [*cuts[1:], size]
    return [block for at, end in zip(cuts, ends, strict=True) for block in _cut(at, end - at)]


def _cut(start: int, size: int) -> list[tuple[int, int]]:
    """``size`` bytes from ``start`` as (offset, size) blocks of at most PIECE_BYTES."""
    end = start + size
    return [(o, min(PIECE_BYTES, end - o)) for o in range(start, end, PIECE_BYTES)]


def _sha(f: BinaryIO, offset: int, size: int) -> str:
    f.seek(offset)
    return hashlib.sha256(f.read(size)).hexdigest()


def batch_body(pieces: list[tuple[str, bytes]]) -> bytes:
    """The body of ``PUT /pieces`` for ``pieces`` (sha256, bytes): one line of JSON,
    ``[[sha256, size], ...]``, then the pieces' bytes one after the other."""
    head = json.dumps([[sha256, len(data)] for sha256, data in pieces]).encode()
    return b"\n".join([head, b"".join(data for _, data in pieces)])


def batches(pieces: list[Piece]) -> Iterator[list[Piece]]:
    """``pieces`` in runs of at most :data:`BATCH_BYTES` (a bigger piece alone), one request
    each."""
    batch: list[Piece] = []
    size = 0
    for piece in pieces:
        if batch and size + piece.size > BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(piece)
        size += piece.size
    if batch:
        yield batch
