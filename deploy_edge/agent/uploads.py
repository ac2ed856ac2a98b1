"""The release files sent to this device, before a deployment takes one: the upload store.

The agent's upload endpoints (:mod:`deploy_edge.agent.service`) are thin layers over
:class:`UploadStore`; its rules are written once, in its docstring, and every refusal is an
:class:`UploadRefused` whose ``reason`` the service turns into an HTTP status.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deploy_edge.wire import Upload
from robo_pipe.errors import RoboPipeError
from robo_pipe.integrity import file_sha256

MIB = 1 << 20

Reason = Literal[
    "not-a-sha256",
    "too-large",
    "no-space",
    "past-size",
    "size-differs",
    "offset",
    "busy",
    "hash-mismatch",
    "not-uploaded",
    "incomplete",
    "missing-pieces",
    "bad-batch",
]
"""Why the store refused a request (:attr:`UploadRefused.reason`)."""


class UploadRefused(RoboPipeError):
    """An upload request the store refuses; the message says why and what to do.

    ``received`` and ``size`` are the upload's bytes on the device and its declared size at
    the refusal (``size`` None: nothing uploaded), so that a client resumes or starts over."""

    def __init__(self, reason: Reason, message: str, received: int = 0, size: int | None = None):
        super().__init__(message)
        self.reason, self.received, self.size = reason, received, size


@dataclass(frozen=True)
class _File:
    """One upload on disk."""

    path: Path
    received: int
    size: int
    complete: bool


class UploadStore:
    """The uploads in ``folder``: release files on their way to a deployment. The rules:

    - **Declared size.** Every write names the upload's total size in bytes; the first write
      of an upload is refused (``too-large``) when that size is over ``max_bytes``, and any
      write (``no-space``) when the bytes still to come would leave less than ``margin_bytes``
      free on the folder's disk. Both before a byte is written. Every later write must declare
      the same size (``size-differs``: delete the upload to start over).
    - **Never past the size.** A chunk whose length (``Content-Length``) goes past the declared
      size is refused before it is written; a chunk streamed without a length that turns out
      longer is undone (the file cut back to the chunk's offset) and refused (``past-size``).
    - **Resume at the bytes the device has.** A write starts at ``offset`` == the bytes
      received; any other offset is refused (``offset``) with that count.
    - **One writer at a time.** An upload being written or deployed is held; a second writer,
      a delete or a deployment of it is refused at once (``busy``) with the count, never
      queued (two writers at one offset would append twice).
    - **Verified when complete.** Once the declared size is received the file is hashed: the
      right sha256 makes it complete (``<sha256>.release``); any other is deleted at once and
      refused (``hash-mismatch``), so a wrong upload never blocks the genuine file. A partial
      upload is ``<sha256>.<size>.part``.
    - **Uploads expire.** One untouched (its mtime) for ``max_age_s``, partial or complete, is
      deleted when the store opens (agent start) and before each new upload. A complete one
      stays until then, so that a refused deployment can be retried (say with ``--force``)
      without sending the release again; once a deployment has put it in a slot
      (:meth:`done_with` ``installed=True``) it is deleted, its bytes being in the slot.
    - **Deployment.** :meth:`hold_for_deployment` gives a complete upload's file (hashed again:
      a file left by an older agent may be wrong; a wrong one is deleted) and holds it until
      :meth:`done_with`; a partial one is refused (``incomplete``) with its counts.
    """

    def __init__(self, folder: Path, max_bytes: int, margin_bytes: int, max_age_s: float):
        """Open the store in ``folder`` (created) and expire its stale partial uploads.
        ``max_bytes``: largest upload; ``margin_bytes``: free bytes every upload leaves;
        ``max_age_s``: seconds a partial upload may stay untouched."""
        self.folder = folder
        self.max_bytes, self.margin_bytes, self.max_age_s = max_bytes, margin_bytes, max_age_s
        self.folder.mkdir(parents=True, exist_ok=True)
        self._guard = threading.Lock()
        self._held: set[str] = set()
        """Uploads being written or deployed (the service's endpoints run on the event loop
        and in worker threads, hence a thread lock around this set)."""
        self.expired_at_start = self.expire()

    # -- reading -------------------------------------------------------------------------------

    def uploads(self) -> list[Upload]:
        """Every upload in the folder, oldest first."""
        names = {path.name.split(".", 1)[0] for path in self.folder.iterdir()}
        found = [self._find(name) for name in names if _is_sha256(name)]
        records = [self._record(f) for f in found if f is not None]
        return sorted(records, key=lambda u: -u.age_s)

    def upload(self, sha256: str) -> Upload:
        """The upload of ``sha256`` (``received`` 0 and ``size`` None when there is none)."""
        found = self._find(checked_sha256(sha256))
        return self._record(found) if found else Upload(sha256, 0, None, 0.0, False)

    # -- writing -------------------------------------------------------------------------------

    async def write(
        self,
        sha256: str,
        offset: int,
        size: int,
        length: int | None,
        chunks: AsyncIterator[bytes],
    ) -> Upload:
        """Append ``chunks`` (``length`` bytes when the request says) at byte ``offset`` of the
        upload of ``sha256``, declared ``size`` bytes in all; the upload afterwards. Raises
        :class:`UploadRefused` by the rules of the class docstring."""
        with self._hold(checked_sha256(sha256)):
            found = self._find(sha256)
            if found is None:
                self.expire()
                self.check_room(sha256, size, size, 0)
                path, received = self.folder / f"{sha256}.{size}.part", 0
            else:
                path, received = found.path, found.received
                if found.size != size:
                    raise UploadRefused(
                        "size-differs",
                        f"upload {sha256[:12]} was declared {found.size} bytes, not {size}; "
                        "delete it (DELETE /uploads/{sha256}) to start over",
                        received,
                        found.size,
                    )
            if found is not None and found.complete:
                return self._record(found)  # nothing left to send
            if offset != received:
                raise UploadRefused(
                    "offset",
                    f"upload {sha256[:12]} has {received} bytes: resume at offset {received}",
                    received,
                    size,
                )
            if length is not None and offset + length > size:
                raise self._past_size(sha256, offset, size)
            self.check_room(sha256, size, size - received, received)
            with path.open("ab") as f:
                written = offset
                async for chunk in chunks:
                    if written + len(chunk) > size:  # no length given, or a lying one
                        f.truncate(offset)
                        raise self._past_size(sha256, offset, size)
                    f.write(chunk)
                    written += len(chunk)
            if written == size:
                return await self._complete(sha256, path, size)
            return self._record(_File(path, written, size, False))

    def delete(self, sha256: str) -> Upload:
        """Delete the upload of ``sha256`` (partial or complete); the upload as it was.
        Refused while it is written or deployed (``busy``) and when there is none."""
        with self._hold(checked_sha256(sha256)):
            found = self._find(sha256)
            if found is None:
                raise UploadRefused("not-uploaded", f"release {sha256[:12]} was not uploaded")
            found.path.unlink()
            return self._record(found)

    def expire(self) -> list[str]:
        """Delete the uploads, partial or complete, untouched for ``max_age_s`` (not those
        held); their sha256s."""
        now, gone = time.time(), []
        for path in [*self.folder.glob("*.part"), *self.folder.glob("*.release")]:
            sha256 = path.name.split(".", 1)[0]
            with self._guard:
                if sha256 in self._held:
                    continue
                try:
                    if now - path.stat().st_mtime > self.max_age_s:
                        path.unlink()
                        gone.append(sha256)
                except FileNotFoundError:
                    continue
        return gone

    # -- deployment ----------------------------------------------------------------------------

    def hold_for_deployment(self, sha256: str) -> Path:
        """The complete, verified release file of ``sha256``, held (not deletable, not
        writable) until :meth:`done_with`. Raises :class:`UploadRefused` when there is none,
        it is partial, held, or its bytes do not hash to ``sha256`` (then it is deleted)."""
        sha256 = checked_sha256(sha256)
        self._take(sha256)
        try:
            found = self._find(sha256)
            if found is None:
                raise UploadRefused("not-uploaded", f"release {sha256[:12]} was not uploaded")
            if not found.complete:
                raise UploadRefused(
                    "incomplete",
                    f"upload {sha256[:12]} is incomplete: {found.received} of {found.size} "
                    "bytes; resume it, or delete it to start over",
                    found.received,
                    found.size,
                )
            if file_sha256(found.path) != sha256:
                found.path.unlink()
                raise self._mismatch(sha256, found.size)
            return found.path
        except BaseException:
            self.done_with(sha256)
            raise

    def done_with(self, sha256: str, installed: bool = False) -> None:
        """Release what :meth:`hold_for_deployment` held; ``installed``: the deployment put
        the release in a slot (live or staged), so its upload is deleted (a redeploy sends it
        again)."""
        with self._guard:
            if installed:
                (self.folder / f"{sha256}.release").unlink(missing_ok=True)
            self._held.discard(sha256)

    # -- rules ---------------------------------------------------------------------------------

    def _find(self, sha256: str) -> _File | None:
        """The upload of ``sha256`` on disk, if any (complete wins over a stray partial)."""
        complete = self.folder / f"{sha256}.release"
        try:
            size = complete.stat().st_size
            return _File(complete, size, size, True)
        except FileNotFoundError:
            pass
        for path in self.folder.glob(f"{sha256}.*.part"):
            declared = path.name.split(".")[1]
            try:
                if declared.isdigit():
                    return _File(path, path.stat().st_size, int(declared), False)
            except FileNotFoundError:
                continue
        return None

    def _record(self, found: _File) -> Upload:
        try:
            age_s = max(0.0, time.time() - found.path.stat().st_mtime)
        except FileNotFoundError:
            age_s = 0.0
        sha256 = found.path.name.split(".", 1)[0]
        return Upload(sha256, found.received, found.size, round(age_s, 1), found.complete)

    def check_room(self, sha256: str, size: int, remaining: int, received: int) -> None:
        """Refuse an upload over the cap, or one whose ``remaining`` bytes would leave less
        than the margin free."""
        if size > self.max_bytes:
            raise UploadRefused(
                "too-large",
                f"upload {sha256[:12]} declares {size / MIB:.1f} MiB; this device accepts "
                f"releases up to {self.max_bytes / MIB:.1f} MiB (max_release_mb)",
                received,
                None,
            )
        self.check_free(f"upload {sha256[:12]}", remaining, received, size if received else None)

    def check_free(
        self, what: str, remaining: int, received: int = 0, size: int | None = None
    ) -> None:
        """Refuse (``no-space``) ``what`` when its ``remaining`` bytes would leave less than
        the margin free on the folder's disk."""
        free = shutil.disk_usage(self.folder).free
        if free - remaining < self.margin_bytes:
            raise UploadRefused(
                "no-space",
                f"{what}: {remaining / MIB:.1f} MiB more would leave "
                f"{(free - remaining) / MIB:.1f} MiB free on the device, under its margin of "
                f"{self.margin_bytes / MIB:.1f} MiB (free_space_margin_mb); delete old "
                "uploads (robo-pipe device uploads DEVICE --all) or free the disk",
                received,
                size,
            )

    async def _complete(self, sha256: str, path: Path, size: int) -> Upload:
        """Hash the upload just completed: the right sha256 makes it ``.release``, any other
        deletes it."""
        if await asyncio.to_thread(file_sha256, path) != sha256:
            path.unlink()
            raise self._mismatch(sha256, size)
        done = self.folder / f"{sha256}.release"
        os.replace(path, done)
        return self._record(_File(done, size, size, True))

    @staticmethod
    def _mismatch(sha256: str, size: int) -> UploadRefused:
        return UploadRefused(
            "hash-mismatch",
            f"upload {sha256[:12]}: its {size} bytes do not hash to that sha256; deleted: "
            "send it again from byte 0",
            0,
            None,
        )

    @staticmethod
    def _past_size(sha256: str, offset: int, size: int) -> UploadRefused:
        return UploadRefused(
            "past-size",
            f"upload {sha256[:12]}: a chunk at offset {offset} goes past its declared {size} "
            "bytes; nothing of it was kept",
            offset,
            size,
        )

    def _take(self, sha256: str) -> None:
        with self._guard:
            if sha256 not in self._held:
                self._held.add(sha256)
                return
        found = self._find(sha256)
        raise UploadRefused(
            "busy",
            f"upload {sha256[:12]} is being written or deployed; try again when that is done",
            found.received if found else 0,
            found.size if found else None,
        )

    @contextmanager
    def _hold(self, sha256: str) -> Iterator[None]:
        self._take(sha256)
        try:
            yield
        finally:
            self.done_with(sha256)


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def checked_sha256(sha256: str) -> str:
    """``sha256`` if it is 64 lowercase hex digits (it names a file), else refused."""
    if not _is_sha256(sha256):
        raise UploadRefused("not-a-sha256", f"not a sha256: {sha256!r}")
    return sha256
