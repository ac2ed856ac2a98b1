"""The HTTP edge agent as a :class:`~deploy_edge.device.Device`: requests to the agent's
service (:mod:`deploy_edge.agent.service`), answers read back as :mod:`deploy_edge.wire`
records.

Used by ``robo-pipe deploy`` on the release engineer's machine, through
:func:`deploy_edge.device.connect` for a devices-file entry of kind ``agent`` (the default).
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from deploy_edge.device import (
    Device,
    DeviceEntry,
    DeviceError,
    DeviceRefused,
    DeviceUnreachable,
)
from deploy_edge.release.pieces import batch_body, batches, release_pieces
from deploy_edge.wire import (
    Deployment,
    DeviceStatus,
    EpisodeResult,
    Health,
    Origin,
    Sent,
    Upload,
)
from robo_pipe.records import RecordError

CHUNK_BYTES = 1 << 20
"""Upload chunk size; a cut upload resumes at the agent's byte count."""
POLL_S = 0.25
"""How often a deployment under way is asked for its status."""
STALLS = 3
"""Refusals in a row, at one offset, that an upload waits out (another writer holds it) before
it gives up."""

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")


class AgentClient(Device):
    """Requests to one device's agent, authenticated with its bearer token."""

    def __init__(self, entry: DeviceEntry, timeout_s: float = 30.0) -> None:
        import httpx

        super().__init__(entry, timeout_s)
        token = os.environ.get(entry.token_env)
        if not token:
            raise DeviceError(f"device {entry.name}: token variable {entry.token_env} is not set")
        verify: Any = True
        if entry.ca_cert is not None:  # a lab CA (or the agent's self-signed certificate)
            verify = ssl.create_default_context(cafile=str(entry.ca_cert))
        self.http = httpx.Client(
            base_url=entry.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            verify=verify,
        )

    def close(self) -> None:
        """Close the connection to the agent."""
        self.http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The agent's JSON answer; :class:`DeviceUnreachable` when it cannot be reached, a
        :class:`DeviceError` when it refuses the token, :class:`DeviceRefused` for any other
        refusal (with the agent's reason)."""
        return self._read(self._call(method, path, **kwargs), method, path)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        import httpx

        try:
            return self.http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise DeviceUnreachable(f"device {self.entry.name} ({self.entry.url}): {err}") from err

    def _read(self, response: httpx.Response, method: str, path: str) -> Any:
        if response.status_code == 401:  # the agent's detail names the scope the call needs
            raise DeviceError(
                f"device {self.entry.name}: the agent refused the token: {_detail(response)}"
            )
        if response.status_code >= 400:
            detail = _detail(response)
            message = detail.get("message", detail) if isinstance(detail, dict) else detail
            raise DeviceRefused(f"device {self.entry.name}: {method} {path}: {message}")
        return response.json()

    def _answer(self, read: Callable[[Any], T], method: str, path: str, **kwargs: Any) -> T:
        """The agent's answer to ``method path``, read into records by ``read``."""
        answer = self._request(method, path, **kwargs)
        try:
            return read(answer)
        except RecordError as err:  # an agent of another robo-pipe version, say
            raise DeviceError(
                f"device {self.entry.name}: {method} {path}: an answer this client cannot read: "
                f"{err}"
            ) from err

    def health(self) -> Health:
        """The agent's liveness answer."""
        return self._answer(Health.from_json, "GET", "/healthz")

    def upload(
        self,
        release: Path,
        sha256: str,
        on_progress: Callable[[int, int], None] | None = None,
        delta: bool = True,
    ) -> Sent:
        """Send ``release``: only the pieces the agent lacks, which it assembles with what it
        holds (:mod:`deploy_edge.agent.pieces`); with ``delta`` False, or to an agent without
        delta uploads, the whole file in chunks from the bytes it already has (resumable). An
        upload whose bytes the agent finds wrong once complete (it deletes it: a partial left
        by someone else, say) is sent again, once, then refused with the agent's reason.
        ``on_progress(sent, to_send)`` in bytes; returns what was sent."""
        start, total = time.monotonic(), release.stat().st_size
        send = self._send_pieces if delta else self._send
        try:
            sent = send(release, sha256, on_progress)
        except _Mismatch:
            try:
                sent = send(release, sha256, on_progress)
            except _Mismatch as again:
                raise DeviceError(f"device {self.entry.name}: {again}") from None
        return replace(sent, size=total, seconds=round(time.monotonic() - start, 3))

    def _send_pieces(
        self, release: Path, sha256: str, on_progress: Callable[[int, int], None] | None
    ) -> Sent:
        """One pass of the delta upload (the whole file to an agent without delta uploads);
        the missing pieces are asked for again once if some expired before the assembly;
        :class:`_Mismatch` when the agent deleted the assembled file as wrong. An upload the
        agent holds complete (a refused deployment's, kept for a retry) is not sent again."""
        have = self._answer(Upload.from_json, "GET", f"/uploads/{sha256}")
        if have.complete:
            return Sent(0, 0)
        pieces = release_pieces(release)
        recipe = {"size": release.stat().st_size, "pieces": [[p.sha256, p.size] for p in pieces]}
        sent_bytes = sent_pieces = 0
        for attempt in range(2):
            wanted = {"pieces": [p.sha256 for p in pieces]}
            response = self._call("POST", "/pieces/missing", json=wanted)
            if response.status_code in (404, 405):  # an agent from before delta uploads
                return self._send(release, sha256, on_progress)
            lacking = set(self._read(response, "POST", "/pieces/missing")["missing"])
            todo = list({p.sha256: p for p in pieces if p.sha256 in lacking}.values())
            to_send = sum(p.size for p in todo)
            this_round = 0
            with release.open("rb") as f:
                for batch in batches(todo):
                    body = []
                    for piece in batch:
                        f.seek(piece.offset)
                        body.append((piece.sha256, f.read(piece.size)))
                    self._request("PUT", "/pieces", content=batch_body(body))
                    this_round += sum(piece.size for piece in batch)
                    if on_progress:
                        on_progress(this_round, to_send)
            sent_bytes, sent_pieces = sent_bytes + this_round, sent_pieces + len(todo)
            path = f"/uploads/{sha256}/assemble"
            response = self._call("POST", path, json=recipe)
            reason, _ = _upload_refusal(response)
            if reason == "missing-pieces" and attempt == 0:
                continue
            Upload.from_json(self._read(response, "POST", path))
            break
        return Sent(0, sent_bytes, len(pieces), sent_pieces)

    def _send(
        self, release: Path, sha256: str, on_progress: Callable[[int, int], None] | None
    ) -> Sent:
        """One pass of the whole-file upload; :class:`_Mismatch` when the agent deleted it as
        wrong."""
        total = release.stat().st_size
        have = self._answer(Upload.from_json, "GET", f"/uploads/{sha256}")
        if have.size is not None and have.size != total:  # not this file: start over
            self.delete_upload(sha256)
            have = Upload(sha256, 0, None, 0.0, False)
        sent, stalls, first = have.received, 0, have.received
        with release.open("rb") as f:
            while sent < total:
                f.seek(sent)
                chunk = f.read(CHUNK_BYTES)
                path = f"/uploads/{sha256}?offset={sent}&size={total}"
                response = self._call("PUT", path, content=chunk)
                reason, detail = _upload_refusal(response)
                if reason in ("offset", "busy"):  # resume where the agent is
                    stalls = stalls + 1 if detail["received"] == sent else 0
                    if stalls > STALLS:
                        raise DeviceError(f"device {self.entry.name}: {detail['message']}")
                    time.sleep(POLL_S * stalls)
                    sent = int(detail["received"])
                    continue
                sent = Upload.from_json(self._read(response, "PUT", path)).received
                if on_progress:
                    on_progress(sent, total)
        return Sent(total, sent - first)

    def uploads(self) -> list[Upload]:
        """Every upload on the device, partial or complete, oldest first."""
        return self._answer(lambda answer: [Upload.from_json(u) for u in answer], "GET", "/uploads")

    def delete_upload(self, sha256: str) -> Upload:
        """Delete the upload ``sha256`` (refused while it is written or deployed)."""
        return self._answer(Upload.from_json, "DELETE", f"/uploads/{sha256}")

    def deploy(
        self,
        sha256: str,
        force: bool = False,
        on_status: Callable[[DeviceStatus], None] | None = None,
        timeout_s: float = 1800.0,
        systems_test: bool = False,
        origin: Origin | None = None,
        poll_s: float = POLL_S,
    ) -> Deployment:
        """Start the deployment of the uploaded release and follow it to its end, asking for
        the status every ``poll_s``; returns the agent's record of it (state, every step,
        reason). ``systems_test``: a random-weights release may go live (recorded);
        ``origin``: who asks (recorded on the deployment)."""
        before = self.status().last
        earlier = before.id if before else None  # not the answer we wait for
        body = {"sha256": sha256, "force": force, "systems_test": systems_test}
        body |= _origin(origin)
        self._request("POST", "/deployments", json=body)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if on_status:
                on_status(status)
            last = status.last
            if (
                status.running is None
                and last is not None
                and last.id != earlier
                and last.release_sha256 == sha256
            ):
                return last
            time.sleep(poll_s)
        raise DeviceError(f"device {self.entry.name}: no result after {timeout_s:.0f} s")

    def status(self) -> DeviceStatus:
        """The agent's status (active, previous, staged version, lock, deployments)."""
        return self._answer(DeviceStatus.from_json, "GET", "/status")

    def history(self) -> list[Deployment]:
        """Every deployment on the device, newest first."""
        return self._answer(
            lambda answer: [Deployment.from_json(d) for d in answer], "GET", "/history"
        )

    def activate(self, origin: Origin | None = None) -> Deployment:
        """Activate the staged version (the agent answers 409 when nothing is staged or the
        robot-busy lock is set: a :class:`DeviceRefused`)."""
        return self._answer(Deployment.from_json, "POST", "/activate", json=_origin(origin))

    def episode(self, instruction: str | None = None, max_ticks: int = 100) -> EpisodeResult:
        """Run the active policy for one episode on the device's robot."""
        body = {"instruction": instruction, "max_ticks": max_ticks}
        return self._answer(EpisodeResult.from_json, "POST", "/episode", json=body)

    def rollback(self, release: int | None = None, origin: Origin | None = None) -> Deployment:
        """Back to the previous version (``release``: only if it is that release)."""
        body = {"release": release} | _origin(origin)
        return self._answer(Deployment.from_json, "POST", "/rollback", json=body)

    def unstage(self, origin: Origin | None = None) -> Deployment:
        """Drop the staged version; its record, now ``unstaged``."""
        return self._answer(Deployment.from_json, "POST", "/unstage", json=_origin(origin))


def _origin(origin: Origin | None) -> dict[str, Any]:
    """The ``origin`` field of a request's body (none when the caller did not say)."""
    return {"origin": origin.to_json()} if origin is not None else {}


class _Mismatch(Exception):
    """The agent deleted a completed upload whose bytes did not hash to its sha256."""


def _upload_refusal(response: httpx.Response) -> tuple[str | None, Any]:
    """An upload refusal's reason and detail (None and the detail for other answers);
    :class:`_Mismatch` when the agent deleted the upload as wrong (``hash-mismatch``)."""
    detail = _detail(response)
    reason = detail.get("reason") if isinstance(detail, dict) else None
    if reason == "hash-mismatch":
        raise _Mismatch(detail["message"])
    return reason, detail


def _detail(response: httpx.Response) -> Any:
    """The ``detail`` of an agent's refusal (a dict for upload refusals), else None."""
    if response.status_code < 400:
        return None
    try:
        return response.json().get("detail")
    except ValueError:
        return response.reason_phrase
