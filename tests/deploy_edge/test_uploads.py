"""Uploads that cannot wedge or fill the device, through a real agent (its FastAPI app under
uvicorn on 127.0.0.1) and the deploy client: a wrong partial under the genuine sha256 is
recovered by the genuine client, which then deploys; two writers at one offset never append
twice; an upload over the cap or the free-space margin, or a chunk past its declared size, is
refused before a byte is written; abandoned uploads expire, so 100 of them leave the disk
bounded; an operator lists and deletes uploads (not one being deployed)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy_edge.agent.config import DeviceConfig
from deploy_edge.agent.deployer import Deployer
from deploy_edge.agent.service import create_app
from deploy_edge.client import AgentClient
from deploy_edge.device import DeviceEntry
from deploy_edge.wire import Upload
from tests.deploy_edge.test_deployer import device_config, keys, releases

__all__ = ["keys", "releases"]  # the fixtures this module shares with the deployer's tests

TOKEN, READ_TOKEN = "uploads-deploy-token", "uploads-read-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config(state: Path, pub: Path, **overrides: Any) -> DeviceConfig:
    """The deployer tests' device, with a deploy token and a read token."""
    tokens = {"read": [sha(READ_TOKEN.encode())], "deploy": [sha(TOKEN.encode())]}
    return device_config(state, pub, tokens=tokens, **overrides)


@contextmanager
def running_agent(device: DeviceConfig, app: Any = None) -> Iterator[str]:
    """The agent's app (``app``, default the one ``device`` makes) served by uvicorn on a free
    loopback port (a thread); its URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = app or create_app(device, Deployer(device))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the agent did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def agent(tmp_path: Path, keys: tuple[Path, Path]) -> Iterator[str]:
    """A fresh agent (cap 1 MiB: the tiny release is ~100 KiB; partial uploads expire after
    an hour)."""
    device = config(tmp_path / "state", keys[1], max_release_mb=1.0, upload_max_age_h=1.0)
    with running_agent(device) as url:
        yield url


def client(url: str) -> AgentClient:
    os.environ["UPLOADS_TOKEN"] = TOKEN
    return AgentClient(DeviceEntry(name="dev-1", url=url, token_env="UPLOADS_TOKEN"))


def put(url: str, sha256: str, offset: int, size: int, content: Any) -> httpx.Response:
    return httpx.put(
        f"{url}/uploads/{sha256}?offset={offset}&size={size}", content=content, headers=AUTH
    )


def upload_files(state: Path) -> dict[str, int]:
    """The files of the uploads folder, name -> bytes."""
    return {p.name: p.stat().st_size for p in (state / "uploads").iterdir()}


def test_a_wrong_partial_under_the_genuine_sha_is_recovered_by_the_genuine_client(
    agent: str, releases: Callable[..., Path]
) -> None:
    """Someone sent wrong bytes under the genuine release's sha256: a deployment of it is
    refused with the counts (never a wedge), the genuine client resumes, the agent deletes the
    completed mismatch, the client starts over from byte 0 once, and the release deploys."""
    release = releases(1)
    data = release.read_bytes()
    genuine = sha(data)
    half = len(data) // 2
    assert put(agent, genuine, 0, len(data), b"\0" * half).status_code == 200
    early = httpx.post(f"{agent}/deployments", json={"sha256": genuine}, headers=AUTH)
    assert early.status_code == 409, early.text
    assert early.json()["detail"]["reason"] == "incomplete"
    assert (early.json()["detail"]["received"], early.json()["detail"]["size"]) == (half, len(data))

    sent: list[int] = []
    device = client(agent)
    device.upload(release, genuine, lambda done, total: sent.append(done), delta=False)
    assert min(sent) > half, "resumed after the wrong bytes first"
    assert sent.count(len(data)) == 1 and sent[-1] == len(data), "then sent again from 0"
    (left,) = device.uploads()
    assert left == Upload(genuine, len(data), len(data), left.age_s, True)
    done = device.deploy(genuine)
    assert done.state == "active", done.reason


def test_an_upload_of_another_size_is_deleted_by_the_genuine_client(
    agent: str, releases: Callable[..., Path]
) -> None:
    """A partial declared at another size under the genuine sha256: later writes of the true
    size are refused (size-differs); the genuine client deletes it and starts over."""
    release = releases(1)
    data = release.read_bytes()
    genuine = sha(data)
    assert put(agent, genuine, 0, len(data) + 7, b"x" * 10).status_code == 200
    mixed = put(agent, genuine, 10, len(data), data[10:20])
    assert mixed.status_code == 409 and mixed.json()["detail"]["reason"] == "size-differs"
    client(agent).upload(release, genuine, delta=False)
    assert client(agent).uploads()[0].complete


def test_a_complete_upload_with_wrong_bytes_is_deleted_at_once(agent: str, tmp_path: Path) -> None:
    data = b"genuine release bytes" * 100
    wrong = put(agent, sha(data), 0, len(data), b"?" * len(data))
    assert wrong.status_code == 422, wrong.text
    assert "send it again from byte 0" in wrong.json()["detail"]["message"]
    assert upload_files(tmp_path / "state") == {}, "nothing left to block the genuine file"


def test_two_writers_at_one_offset_never_append_twice(agent: str, tmp_path: Path) -> None:
    """A first PUT streams its chunk slowly; a second PUT at the same offset meanwhile is
    refused (409 busy, with the agent's count), and the file holds each byte once."""
    data = os.urandom(300_000)
    first_part = 100_000
    release = threading.Event()

    def slow_body() -> Iterator[bytes]:
        yield data[:first_part]
        release.wait(10)
        yield data[first_part:]

    answers: list[httpx.Response] = []
    writer = threading.Thread(
        target=lambda: answers.append(put(agent, sha(data), 0, len(data), slow_body()))
    )
    writer.start()
    deadline = time.monotonic() + 10
    while client(agent).uploads() == [] or client(agent).uploads()[0].received < first_part:
        assert time.monotonic() < deadline, "the first chunk never arrived"
        time.sleep(0.02)
    second = put(agent, sha(data), first_part, len(data), data[first_part:])
    release.set()
    writer.join(timeout=10)
    assert second.status_code == 409, second.text
    assert second.json()["detail"]["reason"] == "busy"
    assert second.json()["detail"]["received"] == first_part
    assert answers[0].status_code == 200 and answers[0].json()["complete"], answers[0].text
    assert (tmp_path / "state" / "uploads" / f"{sha(data)}.release").read_bytes() == data


def test_an_upload_past_the_cap_the_margin_or_its_size_writes_nothing(
    agent: str, tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """Refused (413) before a byte is written: a size over max_release_mb, a size that would
    eat into free_space_margin_mb, a chunk longer than the declared size (by its length, or
    streamed without one: cut back to its offset)."""
    state = tmp_path / "state"
    big = put(agent, "b" * 64, 0, 2 * MIB, b"x" * 1000)
    assert big.status_code == 413 and big.json()["detail"]["reason"] == "too-large", big.text
    assert "max_release_mb" in big.json()["detail"]["message"]
    assert upload_files(state) == {}

    over = put(agent, "c" * 64, 0, 10, b"x" * 11)
    assert over.status_code == 413 and over.json()["detail"]["reason"] == "past-size"
    assert upload_files(state) == {}, "refused by its length, before the file was opened"
    assert put(agent, "c" * 64, 0, 10, b"x" * 4).status_code == 200

    def two_chunks() -> Iterator[bytes]:  # no length given; the first is written on its own
        yield b"y" * 4
        time.sleep(0.3)
        yield b"y" * 4

    streamed = put(agent, "c" * 64, 4, 10, two_chunks())
    assert streamed.status_code == 413 and streamed.json()["detail"]["reason"] == "past-size"
    assert upload_files(state) == {f"{'c' * 64}.10.part": 4}, "the chunk was undone"

    full_disk = config(tmp_path / "full", keys[1], free_space_margin_mb=1e12)
    with running_agent(full_disk) as url:
        refused = put(url, "d" * 64, 0, 10, b"x" * 10)
    assert refused.status_code == 413 and refused.json()["detail"]["reason"] == "no-space"
    assert "free_space_margin_mb" in refused.json()["detail"]["message"]
    assert upload_files(tmp_path / "full") == {}


def test_100_refused_and_abandoned_uploads_leave_the_disk_bounded(
    agent: str, tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """50 uploads over the cap write nothing; 50 abandoned halfway stay until they are older
    than upload_max_age_h, then the next new upload (and an agent start) deletes them; a
    complete upload never deployed expires the same way."""
    state = tmp_path / "state"
    for i in range(50):
        assert put(agent, f"{i:064x}", 0, 2 * MIB, b"x" * 100).status_code == 413
    for i in range(50, 100):
        assert put(agent, f"{i:064x}", 0, 20_000, b"x" * 10_000).status_code == 200
    on_disk = sum(upload_files(state).values())
    assert on_disk == 50 * 10_000, "refused uploads wrote nothing"
    print(f"after 100 refused/abandoned uploads: {on_disk / 1e6:.2f} MB in uploads/")
    old = time.time() - 2 * 3600
    for path in list((state / "uploads").iterdir())[:25]:
        os.utime(path, (old, old))
    assert put(agent, "e" * 64, 0, 20_000, b"x" * 10).status_code == 200  # a new upload
    assert len(upload_files(state)) == 26, "25 expired before the new upload"
    assert put(agent, sha(b"done"), 0, 4, b"done").status_code == 200  # a complete one
    assert f"{sha(b'done')}.release" in upload_files(state)
    for path in (state / "uploads").iterdir():
        os.utime(path, (old, old))
    with running_agent(config(state, keys[1], upload_max_age_h=1.0)):
        assert upload_files(state) == {}, "the rest expired at agent start"


def test_uploads_are_listed_and_deleted_but_not_while_deployed(
    agent: str, releases: Callable[..., Path]
) -> None:
    """GET /uploads (a read token does) and DELETE /uploads/{sha256} (a deploy token; a read
    token is refused); a deployment holds its upload: deleting it meanwhile is refused; once
    installed in a slot the upload is deleted, a refused one kept for a retry."""
    release = releases(1)
    genuine = sha(release.read_bytes())
    device = client(agent)
    device.upload(release, genuine)
    assert put(agent, "f" * 64, 0, 100, b"x" * 10).status_code == 200
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    listed = httpx.get(f"{agent}/uploads", headers=read).json()
    assert {(u["sha256"], u["received"], u["complete"]) for u in listed} == {
        (genuine, release.stat().st_size, True),
        ("f" * 64, 10, False),
    }
    assert httpx.delete(f"{agent}/uploads/{'f' * 64}", headers=read).status_code == 403
    assert device.delete_upload("f" * 64).received == 10
    assert [u.sha256 for u in device.uploads()] == [genuine]

    started = httpx.post(f"{agent}/deployments", json={"sha256": genuine}, headers=AUTH)
    assert started.status_code == 200, started.text
    held = httpx.delete(f"{agent}/uploads/{genuine}", headers=AUTH)
    assert held.status_code == 409 and held.json()["detail"]["reason"] == "busy", held.text
    while (status := device.status()).running is not None or status.last is None:
        time.sleep(0.1)
    assert status.last.state == "active", status.last.reason
    assert device.uploads() == [], "installed in a slot: its upload is deleted"
    device.upload(release, genuine)
    again = device.deploy(genuine)
    assert again.state == "refused" and "already the active version" in again.reason
    assert [u.sha256 for u in device.uploads()] == [genuine], "kept for a retry when refused"
    assert device.delete_upload(genuine).complete and device.uploads() == []
