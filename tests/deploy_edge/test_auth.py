"""Scoped tokens and a config that is whole before the agent listens, through the entry points a
user touches: the agent's HTTP endpoints and ``WS /policy`` (FastAPI's TestClient over
``create_app``), ``python -m deploy_edge.agent`` and ``robo-pipe edge-agent`` (subprocesses).

Scopes: read < deploy < operate. A read token is refused on a deployment and on ``/episode``; a
deploy token on ``force``, ``/episode`` and ``WS /policy``; operate passes all (the calls then
answer 404/409 for their own reasons: nothing is deployed). A bare token (no ``Bearer``) is
refused; a scope holds several hashes, so tokens rotate; a refusal is logged with the endpoint
and the scope it lacked, never the token or its hash. At start the agent refuses plaintext off
loopback (unless ``allow_plaintext_off_loopback``), a trusted key that is not a key, and a bad
certificate: one line naming the file, exit 2, before anything listens."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import WebSocketDisconnect
from fastapi.testclient import TestClient

from deploy_edge.agent.config import SCOPES, DeviceConfigError, load_device_config
from deploy_edge.agent.deployer import Deployer
from deploy_edge.agent.service import create_app
from pipelines.services.local_servers import free_port
from tests.deploy_edge.test_deployer import device_config, keys
from tests.pipelines.test_deploy import self_signed_certificate

ROBO_PIPE = str(Path(sys.executable).with_name("robo-pipe"))
"""The console script beside this interpreter (CI runs the venv's tools by path, not on PATH)."""

__all__ = ["keys"]  # the fixture this module shares with the deployer's tests

ROOT = Path(__file__).resolve().parents[2]
READ, DEPLOY, OPERATE = "read-token", "deploy-token", "operate-token"
ROTATED = "deploy-token-2026"
"""A second deploy token beside DEPLOY: both valid while clients move to the new one."""
UNSEEN = "0" * 64
"""A sha256 nothing was uploaded under."""


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def agent(tmp_path: Path, keys: tuple[Path, Path]) -> Iterator[TestClient]:
    """An agent with nothing deployed and a token per scope (two in deploy)."""
    tokens = {"read": [sha(READ)], "deploy": [sha(DEPLOY), sha(ROTATED)], "operate": [sha(OPERATE)]}
    config = device_config(tmp_path / "state", keys[1], tokens=tokens)
    with TestClient(create_app(config, Deployer(config))) as client:
        yield client


def request(agent: TestClient, endpoint: str, token: str) -> tuple[int, Any]:
    """``endpoint`` ("METHOD /path", ``?force`` for a forced deployment) called with ``token``:
    its status code and JSON answer (one body serves every endpoint: each reads its fields)."""
    method, path = endpoint.split(" ")
    body = {"sha256": UNSEEN, "force": path.endswith("?force"), "max_ticks": 1}
    answer = agent.request(method, path.removesuffix("?force"), json=body, headers=bearer(token))
    return answer.status_code, answer.json()


NEEDS = {
    "GET /status": "read",
    "GET /history": "read",
    "POST /deployments": "deploy",
    "POST /activate": "deploy",
    "POST /rollback": "deploy",
    "POST /unstage": "deploy",
    "POST /deployments?force": "operate",
    "POST /episode": "operate",
}
"""The scope each endpoint needs."""
SCOPE_OF = {READ: "read", DEPLOY: "deploy", ROTATED: "deploy", OPERATE: "operate"}


@pytest.mark.parametrize("endpoint", list(NEEDS))
def test_each_endpoint_refuses_a_lower_scope_naming_the_one_it_needs(
    agent: TestClient, endpoint: str
) -> None:
    """A lower scope: 403 naming the scope needed; an equal or higher one passes (the call
    then answers for its own reasons: 404/409 with nothing deployed, never 422 for a field the
    endpoint could not read)."""
    needed = NEEDS[endpoint]
    for token, scope in SCOPE_OF.items():
        status, answer = request(agent, endpoint, token)
        if SCOPES.index(scope) < SCOPES.index(needed):
            assert status == 403, (endpoint, token, answer)
            # A read token asking to force is refused at the first scope it lacks: deploy.
            named = "deploy" if endpoint.endswith("?force") and scope == "read" else needed
            assert f"needs a token of scope '{named}'" in answer["detail"]
        else:
            assert status not in (401, 403, 422), (endpoint, token, answer)  # 422: unread token


def test_a_bare_token_an_unknown_one_and_none_are_refused(agent: TestClient) -> None:
    for headers in ({"Authorization": OPERATE}, {"Authorization": f"Basic {OPERATE}"}, {}):
        answer = agent.get("/status", headers=headers)
        assert answer.status_code == 401, headers
        assert answer.json()["detail"] == (
            "GET /status needs a token of scope 'read': expected 'Authorization: Bearer <token>'"
        )
    answer = agent.get("/status", headers=bearer("retired-token"))
    assert answer.status_code == 401 and "unknown bearer token" in answer.json()["detail"]


def test_tokens_rotate_two_hashes_in_one_scope_both_pass(agent: TestClient) -> None:
    assert agent.post("/rollback", headers=bearer(DEPLOY)).status_code == 409  # nothing to undo
    assert agent.post("/rollback", headers=bearer(ROTATED)).status_code == 409


def test_the_policy_server_needs_operate(agent: TestClient) -> None:
    """``WS /policy`` drives the robot: a deploy token is refused in the handshake (403 naming
    operate), an operate token gets the first frame (nothing deployed)."""
    for token in (READ, DEPLOY):
        with (
            pytest.raises(WebSocketDisconnect) as denied,
            agent.websocket_connect("/policy", headers=bearer(token)),
        ):
            pass
        # the test client raises the denial as a disconnect that is also the HTTP response
        status, text = (getattr(denied.value, name, None) for name in ("status_code", "text"))
        assert status == 403 and "scope 'operate'" in str(text), denied.value
    with agent.websocket_connect("/policy", headers=bearer(OPERATE)) as socket:
        assert "no active version" in socket.receive_json()["error"]


def test_a_refusal_is_logged_with_the_scope_never_the_token(
    agent: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="deploy_edge.agent"):
        agent.post("/episode", json={"max_ticks": 1}, headers=bearer(DEPLOY))
        agent.get("/status", headers={"Authorization": READ})
    lines = [r.getMessage() for r in caplog.records if r.name == "deploy_edge.agent"]
    assert lines == [
        "refused POST /episode: the token's scope is 'deploy'; it needs scope 'operate'",
        "refused GET /status: expected 'Authorization: Bearer <token>'; it needs scope 'read'",
    ]
    for secret in (DEPLOY, sha(DEPLOY), READ, sha(READ)):
        assert secret not in caplog.text


def test_a_single_token_config_is_refused_with_how_to_migrate(tmp_path: Path) -> None:
    file = tmp_path / "device.yaml"
    file.write_text(f"name: x\ntoken_sha256: {sha(DEPLOY)}\nstate_dir: s\n")
    migrate = r"'token_sha256' was replaced by 'tokens'.*'tokens: \{operate: \[<the same hash>\]\}'"
    with pytest.raises(DeviceConfigError, match=migrate):
        load_device_config(file)
    file.write_text("name: x\ntokens: {}\nstate_dir: s\n")
    with pytest.raises(DeviceConfigError, match="no token in any scope"):
        load_device_config(file)


def test_keys_token_prints_a_token_and_the_line_its_scope_takes(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """``robo-pipe keys token --scope read``: the line it prints, pasted under ``tokens``, makes
    a device that lets its token read and not deploy."""
    ran = subprocess.run(
        [ROBO_PIPE, "keys", "token", "--scope", "read"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    token = ran.stdout.strip()
    line = ran.stderr.splitlines()[-1]
    assert line == f"  read: [{sha(token)}]", ran.stderr
    file = tmp_path / "device.yaml"
    file.write_text(f"name: x\nstate_dir: state\ntokens:\n{line}\n")
    config = load_device_config(file)
    with TestClient(create_app(config, Deployer(config))) as agent:
        assert agent.get("/status", headers=bearer(token)).status_code == 200
        assert agent.post("/rollback", headers=bearer(token)).status_code == 403


def start_agent(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``args`` run to the end (a refused start); what it printed."""
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, check=False
    )


def write_config(tmp_path: Path, keys: tuple[Path, Path], **fields: object) -> Path:
    file = tmp_path / "device.yaml"
    body = {"name": "cell-3", "tokens": {"deploy": [sha(DEPLOY)]}, "state_dir": "state"}
    body["trusted_keys"] = [str(keys[1])]
    file.write_text(yaml.safe_dump({**body, **fields}))
    return file


AGENT = (sys.executable, "-m", "deploy_edge.agent", "--config")


def test_a_bad_file_in_the_config_stops_the_agent_before_it_listens(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """A trusted key that is not a key, a certificate that is not one, a key that is not the
    certificate's: one line naming the file, exit 2, no traceback, nothing served."""
    not_a_key = tmp_path / "release-2026.pub"
    not_a_key.write_text("not a key")
    cert, key = self_signed_certificate(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _, other_key = self_signed_certificate(other)
    tls = {"listen": "0.0.0.0:8765", "tls_cert": str(cert)}
    cases: dict[str, dict[str, Any]] = {
        f"field 'trusted_keys': {not_a_key}: not a PEM public key": {
            "trusted_keys": [str(keys[1]), str(not_a_key)]
        },
        f"field 'tls_cert': {not_a_key}: not a PEM certificate": {
            **tls,
            "tls_cert": str(not_a_key),
            "tls_key": str(key),
        },
        f"field 'tls_key': {other_key} does not serve {cert}": {**tls, "tls_key": str(other_key)},
    }
    for expected, fields in cases.items():
        ran = start_agent(*AGENT, str(write_config(tmp_path, keys, **fields)))
        assert ran.returncode == 2, ran.stderr
        assert ran.stderr.startswith(f"error: {expected}"), ran.stderr
        assert len(ran.stderr.splitlines()) == 1 and "Traceback" not in ran.stderr
    file = write_config(tmp_path, keys, trusted_keys=[str(not_a_key)])
    ran = start_agent(ROBO_PIPE, "edge-agent", "--device-config", str(file))
    assert ran.returncode == 2 and "Traceback" not in ran.stdout + ran.stderr, ran.stderr
    assert f"field 'trusted_keys': {not_a_key}: not a PEM public key" in ran.stdout + ran.stderr


def test_plaintext_off_loopback_is_refused_at_start_unless_the_config_accepts_it(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    """``0.0.0.0`` without a certificate: exit 2 naming the field that accepts plaintext; with
    ``allow_plaintext_off_loopback: true`` the agent serves and warns."""
    port = free_port()
    file = write_config(tmp_path, keys, listen=f"0.0.0.0:{port}")
    ran = start_agent(*AGENT, str(file))
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert f"field 'listen' = '0.0.0.0:{port}'" in ran.stderr
    assert "allow_plaintext_off_loopback: true" in ran.stderr
    file = write_config(tmp_path, keys, listen=f"0.0.0.0:{port}", allow_plaintext_off_loopback=True)
    log = tmp_path / "agent.log"
    with log.open("w") as out, subprocess.Popen([*AGENT, str(file)], stderr=out, cwd=ROOT) as agent:
        try:
            deadline = time.monotonic() + 60
            while True:
                assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
        finally:
            agent.terminate()
            agent.wait(timeout=20)
    assert f"serving plain HTTP on 0.0.0.0:{port}" in log.read_text()
