"""Delta uploads: the pieces a device holds, the pieces a client sends, and a release file
assembled from both.

A client cuts its release file into pieces (:func:`deploy_edge.release.pieces.release_pieces`)
and asks which the device lacks (:meth:`PieceStore.missing`); the device holds the pieces of
every bundle file in its slots (active, previous, staged) and the pieces sent to it. The client
sends the missing ones (:meth:`PieceStore.put`: each hashed on arrival, a wrong one refused and
never kept), then asks the device to assemble the release (:meth:`PieceStore.assemble`): its
bytes, piece by piece in the recipe's order, go through the upload store's own write
(:meth:`deploy_edge.agent.uploads.UploadStore.write`), so every upload rule holds (declared
size, the cap, the free-space margin, one writer, and the whole file hashed to the release's
sha256 before it is complete). What a deployment then takes is an upload like any other.

A cut connection loses nothing verified: pieces already received stay (until they expire, as
uploads do), so a retry sends only what is still missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from deploy_edge.agent.uploads import MIB, UploadRefused, UploadStore, checked_sha256
from deploy_edge.release.pieces import MAX_BATCH_BYTES, MAX_PIECE_BYTES, bundle_pieces
from deploy_edge.wire import Upload

Recipe = list[tuple[str, int]]
"""A release file as pieces in order: (sha256, size) each."""
MAX_RECIPE_PIECES = 1 << 20
"""The most pieces a recipe may list (1 TiB of 1 MiB pieces)."""
_Held = dict[str, tuple[Path, int, int]]
"""sha256 -> (file, offset, size) of a piece in a slot."""


class PieceStore:
    """The pieces sent to this device (``folder``, a file per piece named by its sha256) and
    the pieces of the bundles ``slots()`` returns (their directories), indexed once per
    bundle and cached. ``max_age_s``: a piece untouched this long is deleted (on open and
    before each assembly)."""

    def __init__(
        self,
        folder: Path,
        slots: Callable[[], list[Path]],
        uploads: UploadStore,
        max_age_s: float,
    ) -> None:
        self.folder, self.slots, self.uploads, self.max_age_s = folder, slots, uploads, max_age_s
        self.folder.mkdir(parents=True, exist_ok=True)
        self._indexes: dict[tuple[str, int], _Held] = {}
        self._guard = threading.Lock()
        self.expire()

    def held(self) -> _Held:
        """Every piece of the slots' bundle files, by sha256 (indexed once per bundle)."""
        held: _Held = {}
        keys = []
        for bundle in self.slots():
            try:
                key = (str(bundle), bundle.stat().st_mtime_ns)
            except FileNotFoundError:
                continue
            keys.append(key)
            with self._guard:
                index = self._indexes.get(key)
            if index is None:
                index = _index(bundle)
                with self._guard:
                    self._indexes[key] = index
            held |= index
        with self._guard:  # bundles no longer in a slot
            for key in set(self._indexes) - set(keys):
                del self._indexes[key]
        return held

    def missing(self, wanted: list[str]) -> list[str]:
        """Of the pieces ``wanted`` (sha256s), those the device neither received nor holds in
        a slot, each once, in the order given."""
        for sha256 in wanted:
            checked_sha256(sha256)
        return self._lacking(wanted, self.held())

    def _lacking(self, wanted: list[str], held: _Held) -> list[str]:
        """Of ``wanted``, those neither in ``held`` nor sent, each once, in order."""
        out = {s: None for s in wanted if s not in held and not (self.folder / s).is_file()}
        return list(out)

    async def put(self, length: int | None, chunks: AsyncIterator[bytes]) -> int:
        """Receive a batch of pieces: the body is one line of JSON, ``[[sha256, size], ...]``,
        then the pieces' bytes one after the other (:func:`batch_body`), at most
        :data:`MAX_BATCH_BYTES` in all. Each piece is hashed and kept; the count kept. A piece
        whose bytes do not hash to its sha256 is refused (``hash-mismatch``, naming it) and not
        kept (the ones before it are); a body over the size is refused (``too-large``) before
        (with a length) or while it is read, and a header that does not describe it
        (``bad-batch``)."""
        if length is not None and length > MAX_BATCH_BYTES:
            raise _too_large("batch", length, MAX_BATCH_BYTES)
        self.uploads.check_free("a batch of pieces", length or MAX_BATCH_BYTES)
        body = bytearray()
        async for chunk in chunks:
            body += chunk
            if len(body) > MAX_BATCH_BYTES:
                raise _too_large("batch", len(body), MAX_BATCH_BYTES)
        head, _, data = bytes(body).partition(b"\n")
        try:
            listed = [(checked_sha256(str(sha)), int(size)) for sha, size in json.loads(head)]
        except (ValueError, TypeError, UploadRefused) as err:
            raise UploadRefused(
                "bad-batch", f"a batch whose header is not [[sha256, size], ...]: {err}"
            ) from err
        listed_bytes = sum(size for _, size in listed)
        if listed_bytes != len(data) or any(not 0 < n <= MAX_PIECE_BYTES for _, n in listed):
            raise UploadRefused(
                "bad-batch",
                f"a batch of {len(data)} bytes whose header lists {listed_bytes} (each piece "
                f"1..{MAX_PIECE_BYTES} bytes)",
            )
        at = 0
        for kept, (sha256, size) in enumerate(listed):
            piece, at = data[at : at + size], at + size
            if hashlib.sha256(piece).hexdigest() != sha256:
                raise UploadRefused(
                    "hash-mismatch",
                    f"piece {sha256[:12]}: its {size} bytes do not hash to that sha256; not kept "
                    f"({kept} before it were): send it again",
                )
            await asyncio.to_thread(self._keep, sha256, piece)
        return len(listed)

    def _keep(self, sha256: str, piece: bytes) -> None:
        fd, temp = tempfile.mkstemp(prefix=f".{sha256}.", dir=self.folder)
        with os.fdopen(fd, "wb") as f:
            f.write(piece)
        os.replace(temp, self.folder / sha256)

    async def assemble(self, sha256: str, size: int, recipe: Recipe) -> Upload:
        """Write the release ``sha256`` of ``size`` bytes from ``recipe``'s pieces into the
        upload store (resuming a partial upload of it); the upload, complete once its bytes
        hash to ``sha256``. Refused (``missing-pieces``, nothing written) when a piece is
        neither received nor held, or the recipe does not add up to ``size``; the store's own
        rules refuse the rest. The received pieces it used are deleted once it is complete."""
        checked_sha256(sha256)
        _check_recipe(sha256, size, recipe)
        self.expire()
        have = self.uploads.upload(sha256)
        if have.complete:
            return have
        if have.size is not None and have.size != size:
            self.uploads.delete(sha256)
            have = self.uploads.upload(sha256)
        held = await asyncio.to_thread(self.held)
        lacking = self._lacking([s for s, _ in recipe], held)
        if lacking:
            raise UploadRefused(
                "missing-pieces",
                f"release {sha256[:12]}: {len(lacking)} pieces are neither sent nor held "
                f"(first: {lacking[0][:12]}); send them, then assemble again",
                have.received,
                have.size,
            )
        done = await self.uploads.write(
            sha256, have.received, size, None, self._bytes(recipe, held, have.received)
        )
        if done.complete:
            for piece, _ in recipe:
                (self.folder / piece).unlink(missing_ok=True)
        return done

    async def _bytes(self, recipe: Recipe, held: _Held, start: int) -> AsyncIterator[bytes]:
        """The recipe's bytes from byte ``start``, piece by piece."""
        at = 0
        for sha256, size in recipe:
            if at + size > start:
                data = await asyncio.to_thread(self._read, sha256, size, held)
                yield data[max(0, start - at) :]
            at += size

    def _read(self, sha256: str, size: int, held: _Held) -> bytes:
        sent = self.folder / sha256
        if sent.is_file():
            return sent.read_bytes()[:size]
        path, offset, length = held[sha256]
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(min(size, length))

    def expire(self) -> list[str]:
        """Delete the pieces untouched for ``max_age_s``; their sha256s."""
        now, gone = time.time(), []
        for path in self.folder.iterdir():
            try:
                if now - path.stat().st_mtime > self.max_age_s:
                    path.unlink()
                    gone.append(path.name)
            except FileNotFoundError:
                continue
        return gone


def _index(bundle: Path) -> _Held:
    """The pieces of every file under ``bundle``."""
    held: _Held = {}
    for path, piece in bundle_pieces(bundle):
        held.setdefault(piece.sha256, (path, piece.offset, piece.size))
    return held


def _check_recipe(sha256: str, size: int, recipe: Recipe) -> None:
    """A recipe of well-formed pieces that adds up to ``size``, else ``missing-pieces``."""
    problem = ""
    if not recipe or len(recipe) > MAX_RECIPE_PIECES:
        problem = f"{len(recipe)} pieces (1 to {MAX_RECIPE_PIECES})"
    elif any(not 0 < n <= MAX_PIECE_BYTES for _, n in recipe):
        problem = f"a piece size outside 1..{MAX_PIECE_BYTES} bytes"
    elif sum(n for _, n in recipe) != size:
        problem = f"pieces adding up to {sum(n for _, n in recipe)} bytes, not the {size} declared"
    if problem:
        raise UploadRefused("missing-pieces", f"release {sha256[:12]}: the recipe has {problem}")
    for piece, _ in recipe:
        checked_sha256(piece)


def _too_large(what: str, size: int, most: int) -> UploadRefused:
    return UploadRefused(
        "too-large", f"a {what} of {size / MIB:.2f} MiB is over the {most / MIB:g} MiB it may have"
    )
