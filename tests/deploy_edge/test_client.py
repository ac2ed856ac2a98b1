"""The deploy client against an agent replayed at its HTTP seam, answer by answer: it waits for
the record of the deployment it started, not the agent's earlier record of the same release
(still the agent's "last" until the new deployment is recorded); it reads the agent's JSON, as
the agent writes it, into the wire records; a device entry's kind picks its class."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy_edge.client import AgentClient
from deploy_edge.device import DeviceEntry, DeviceError, connect, load_device
from deploy_edge.wire import Deployment, DeviceStatus, GateFigures, Origin, Slot

SHA = "a" * 64


def record(id_: str, state: str) -> dict[str, Any]:
    """A deployment as the agent sends it (every field, in the agent's order)."""
    return {
        "id": id_,
        "release_sha256": SHA,
        "model_name": "reach",
        "model_version": "3",
        "release": 3,
        "state": state,
        "steps": [{"name": "verify", "ok": True, "seconds": 0.1, "detail": "signed by k"}],
        "reason": "",
        "forced": [],
        "started_at": "2025-01-01T00:00:00+00:00",
        "finished_at": None,
        "gate": {
            "p50_ms": 1.0,
            "p95_ms": 2.0,
            "p99_ms": 3.0,
            "max_ms": 4.0,
            "misses": 0.0,
            "budget_ms": 100.0,
            "mode": "async",
            "inference_p99_ms": 40.0,
            "action_age_p99_ms": 120.0,
            "seam_jump_max": 0.01,
            "instruction_encode_p50_ms": None,
        },
        "variant": "int8",
        "trials": [
            {
                "variant": "fp32",
                "precision": "fp32",
                "relative_error": 0.0,
                "candidate": True,
                "failure": "p99 120.00 ms > budget 100 ms",
                "p99_ms": 120.0,
                "misses": 0,
                "chosen": False,
            },
            {
                "variant": "int8",
                "precision": "int8",
                "relative_error": 0.02,
                "candidate": True,
                "failure": "",
                "p99_ms": 3.0,
                "misses": 0,
                "chosen": True,
            },
        ],
        "choice": "int8: the most accurate candidate within 100 ms",
        "systems_test": False,
        "origin": {"by": "fleet", "rollout": "r-1", "flow_run": "http://prefect/runs/f-1"},
    }


def status(running: dict[str, Any] | None, last: dict[str, Any] | None) -> dict[str, Any]:
    """A ``GET /status`` answer as the agent sends it."""
    slot = {
        "model_name": "reach",
        "model_version": "2",
        "release": 2,
        "path": "/s",
        "sha256": SHA,
        "content_sha256": "c" * 64,
        "variant": "int8",
        "precision": "int8",
        "systems_test": True,
        "expires_at": "2025-02-01T00:00:00+00:00",
    }
    return {
        "device": "dev",
        "target": "local-cpu",
        "active": slot,
        "previous": None,
        "staged": None,
        "locked": False,
        "running": running,
        "last": last,
        "floor": {"reach": 3},
        "notices": ["the active release reach:2 (release 2) expired at 2025-02-01T00:00:00+00:00"],
    }


def replayed(
    monkeypatch: pytest.MonkeyPatch, agent: Callable[[httpx.Request], httpx.Response]
) -> AgentClient:
    """A client whose requests ``agent`` answers."""
    monkeypatch.setenv("DEV_TOKEN", "t")
    client = AgentClient(DeviceEntry(name="dev", url="http://agent", token_env="DEV_TOKEN"))
    client.http = httpx.Client(base_url="http://agent", transport=httpx.MockTransport(agent))
    return client


def test_deploy_waits_for_its_own_record_not_the_earlier_one_of_the_same_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    earlier = record("d-1", "active")  # the release went live before
    answers = iter(
        [
            status(None, earlier),  # read before the POST
            status(None, earlier),  # the new deployment is not recorded yet
            status(record("d-2", "running"), earlier),
            status(None, record("d-2", "refused")),
        ]
    )
    seen: list[str] = []

    def agent(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/status":
            return httpx.Response(200, json=next(answers))
        assert request.url.path == "/deployments" and json.loads(request.content)["sha256"] == SHA
        return httpx.Response(200, json={"accepted": SHA})

    done = replayed(monkeypatch, agent).deploy(SHA, poll_s=0.0)
    assert done.id == "d-2" and done.state == "refused"
    assert seen == ["GET /status", "POST /deployments", *["GET /status"] * 3]


def test_the_agents_answers_are_the_wire_records_and_write_back_the_same_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: dict[str, Any] = {
        "/status": status(None, record("d-1", "active")),
        "/history": [record("d-2", "refused"), record("d-1", "active")],
        "/rollback": record("d-3", "rolled_back"),
        "/activate": record("d-4", "active"),
        "/healthz": {"ok": True, "device": "dev"},
        "/episode": {
            "version": "reach:3",
            "success": None,
            "ticks": 7,
            "p50_ms": 1.0,
            "p99_ms": 2.0,
            "misses": 0,
            "errors": 0,
        },
    }
    client = replayed(monkeypatch, lambda r: httpx.Response(200, json=answers[r.url.path]))
    now = client.status()
    assert isinstance(now, DeviceStatus) and isinstance(now.active, Slot)
    assert now.active.label == "reach:2" and now.last is not None
    assert now.last.gate == GateFigures(1.0, 2.0, 3.0, 4.0, 0.0, 100.0, "async", 40.0, 120.0, 0.01)
    assert now.last.step("verify") is not None and now.last.step("gate") is None
    history = client.history()
    assert [d.id for d in history] == ["d-2", "d-1"] and isinstance(history[0], Deployment)
    assert client.rollback().state == "rolled_back" and client.activate().id == "d-4"
    assert client.health().device == "dev" and client.episode(None, 7).ticks == 7
    # byte-compatible: a record written back is the agent's JSON, key for key, in order
    assert json.dumps(now.to_json()) == json.dumps(answers["/status"])
    assert json.dumps([d.to_json() for d in history]) == json.dumps(answers["/history"])
    # an agent from before the release floor: its answer loads, with no floor and no notice
    old = {k: v for k, v in answers["/status"].items() if k not in ("floor", "notices")}
    assert DeviceStatus.from_json(old).floor == {} and DeviceStatus.from_json(old).notices == []
    # a slot from before content digests loads with none (deploy compares its release file)
    slot = {k: v for k, v in answers["/status"]["active"].items() if k != "content_sha256"}
    assert Slot.from_json(slot).content_sha256 == ""
    # a deployment from before origins loads with none
    assert Deployment.from_json(record("d-0", "active") | {"origin": None}).origin is None
    before = {k: v for k, v in record("d-0", "active").items() if k != "origin"}
    assert Deployment.from_json(before).origin is None
    assert history[0].origin == Origin("fleet", "r-1", "http://prefect/runs/f-1")


def test_an_answer_the_client_cannot_read_is_a_named_device_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = replayed(monkeypatch, lambda r: httpx.Response(200, json={"ok": True}))
    with pytest.raises(DeviceError, match=r"device dev: GET /healthz: .*missing field device"):
        client.health()


def test_an_entrys_kind_picks_its_device_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEV_TOKEN", "t")
    entry = DeviceEntry(name="dev", url="http://agent", token_env="DEV_TOKEN")
    assert entry.kind == "agent"
    with connect(entry) as device:
        assert isinstance(device, AgentClient) and device.entry == entry
    with pytest.raises(ValueError, match="unknown device kind; valid choices: agent"):
        DeviceEntry(name="dev", kind="ros2", url="http://agent", token_env="DEV_TOKEN")


def test_a_devices_file_error_names_the_file_the_field_and_the_value(tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    with pytest.raises(DeviceError, match=r"devices\.yaml: no such devices file"):
        load_device(devices, "arm")
    devices.write_text("devices: [{name: arm, url: ftp://arm, token_env: T}]\n")
    with pytest.raises(DeviceError, match=r"devices\.yaml: field 'devices\.0\.url' = 'ftp://arm'"):
        load_device(devices, "arm")
    devices.write_text(
        "devices: [{name: arm, url: 'http://arm:8765', token_env: T, ca_cert: ca.pem}]\n"
    )
    with pytest.raises(DeviceError, match=r"no device 'hand'; devices: arm"):
        load_device(devices, "hand")
    assert load_device(devices, "arm").ca_cert == tmp_path / "ca.pem", "relative to the file"
