"""The deploy client's one subtle rule: it waits for the record of the deployment it started,
not the agent's earlier record of the same release (still the agent's "last" until the new
deployment is recorded). The agent is replayed at its HTTP seam, answer by answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from deploy_edge.client import AgentClient, DeviceEntry

SHA = "a" * 64


def record(id_: str, state: str) -> dict[str, Any]:
    return {"id": id_, "release_sha256": SHA, "state": state, "steps": [], "reason": ""}


def test_deploy_waits_for_its_own_record_not_the_earlier_one_of_the_same_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    earlier = record("d-1", "active")  # the release went live before
    answers = iter(
        [
            {"running": None, "last": earlier},  # read before the POST
            {"running": None, "last": earlier},  # the new deployment is not recorded yet
            {"running": record("d-2", "running"), "last": earlier},
            {"running": None, "last": record("d-2", "refused")},
        ]
    )
    seen: list[str] = []

    def agent(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/status":
            return httpx.Response(200, json=next(answers))
        assert request.url.path == "/deployments" and json.loads(request.content)["sha256"] == SHA
        return httpx.Response(200, json={"accepted": SHA})

    monkeypatch.setenv("DEV_TOKEN", "t")
    client = AgentClient(DeviceEntry(name="dev", url="http://agent", token_env="DEV_TOKEN"))
    client.http = httpx.Client(base_url="http://agent", transport=httpx.MockTransport(agent))
    done = client.deploy(SHA, poll_s=0.0)
    assert done["id"] == "d-2" and done["state"] == "refused"
    assert seen == ["GET /status", "POST /deployments", *["GET /status"] * 3]
