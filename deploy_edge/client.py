"""The deploy client: talks to edge agents (:mod:`deploy_edge.agent.service`) over HTTP.

Used by ``robo-pipe deploy`` on the release engineer's machine. A device is an entry of a
devices file (YAML)::

    devices:
      - name: lab-jetson-03
        url: https://lab-jetson-03.local:8765
        token_env: LAB_JETSON_03_TOKEN     # the bearer token is read from this variable
        target: jetson-orin-nano           # its target profile (configs/targets/)
        ca_cert: certs/lab-ca.pem          # optional: trust this CA for the agent's TLS
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from robo_pipe.errors import RoboPipeError

CHUNK_BYTES = 1 << 20
"""Upload chunk size; a cut upload resumes at the agent's byte count."""


class DeviceError(RoboPipeError, ValueError):
    """A device entry is unknown or invalid, its token is not set, or its agent cannot be
    reached or refuses the request (the message says which and why)."""


class DeviceEntry(BaseModel):
    """One device of a devices file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    url: str = Field(pattern=r"^https?://")
    token_env: str = Field(min_length=1)
    """Environment variable holding the bearer token (never the token itself in the file)."""
    target: str = "local-cpu"
    ca_cert: Path | None = None


class DevicesFile(BaseModel):
    """A devices file: ``devices: [...]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: list[DeviceEntry]


def load_device(path: Path, name: str) -> DeviceEntry:
    """The entry ``name`` of the devices file at ``path``; errors name the file and field."""
    if not path.is_file():
        raise DeviceError(f"{path}: devices file not found")
    try:
        parsed = DevicesFile.model_validate(yaml.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, ValidationError) as err:
        raise DeviceError(f"{path}: not a valid devices file: {err}") from err
    found = {d.name: d for d in parsed.devices}
    if name not in found:
        raise DeviceError(f"{path}: no device {name!r}; devices: {', '.join(found) or 'none'}")
    entry = found[name]
    if entry.ca_cert is not None and not entry.ca_cert.is_absolute():
        entry = entry.model_copy(update={"ca_cert": path.parent / entry.ca_cert})
    return entry


class AgentClient:
    """Requests to one device's agent, authenticated with its bearer token."""

    def __init__(self, device: DeviceEntry, timeout_s: float = 30.0) -> None:
        import httpx

        token = os.environ.get(device.token_env)
        if not token:
            raise DeviceError(f"device {device.name}: token variable {device.token_env} is not set")
        self.device = device
        verify: Any = True
        if device.ca_cert is not None:  # a lab CA (or the agent's self-signed certificate)
            verify = ssl.create_default_context(cafile=str(device.ca_cert))
        self.http = httpx.Client(
            base_url=device.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            verify=verify,
        )

    def close(self) -> None:
        """Close the connection to the agent."""
        self.http.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise DeviceError(f"device {self.device.name} ({self.device.url}): {err}") from err
        if response.status_code == 401:
            raise DeviceError(f"device {self.device.name}: the agent refused the token")
        if response.status_code >= 400:
            detail = response.json().get("detail") if response.content else response.reason_phrase
            raise DeviceError(f"device {self.device.name}: {method} {path}: {detail}")
        return response.json()

    def health(self) -> dict[str, Any]:
        """The agent's liveness answer."""
        return dict(self._request("GET", "/healthz"))

    def upload(
        self, release: Path, sha256: str, on_progress: Callable[[int, int], None] | None = None
    ) -> None:
        """Send ``release`` in chunks from the bytes the agent already has (resumable)."""
        total = release.stat().st_size
        sent = int(self._request("GET", f"/uploads/{sha256}")["received"])
        with release.open("rb") as f:
            f.seek(sent)
            while sent < total:
                chunk = f.read(CHUNK_BYTES)
                answer = self._request("PUT", f"/uploads/{sha256}?offset={sent}", content=chunk)
                sent = int(answer["received"])
                if on_progress:
                    on_progress(sent, total)

    def deploy(
        self,
        sha256: str,
        force: bool = False,
        on_status: Callable[[dict[str, Any]], None] | None = None,
        timeout_s: float = 1800.0,
        poll_s: float = 0.5,
    ) -> dict[str, Any]:
        """Start the deployment of the uploaded release and follow it to its end; returns the
        agent's record of it (state, every step, reason)."""
        earlier = (self.status().get("last") or {}).get("id")  # not the answer we wait for
        self._request("POST", "/deployments", json={"sha256": sha256, "force": force})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if on_status:
                on_status(status)
            last: dict[str, Any] = status.get("last") or {}
            ended = status.get("running") is None and last.get("id") not in (None, earlier)
            if ended and last["release_sha256"] == sha256:
                return last
            time.sleep(poll_s)
        raise DeviceError(f"device {self.device.name}: no result after {timeout_s:.0f} s")

    def status(self) -> dict[str, Any]:
        """The agent's status (active, previous, staged version, lock, deployments)."""
        return dict(self._request("GET", "/status"))

    def history(self) -> list[dict[str, Any]]:
        """Every deployment on the device, newest first."""
        return list(self._request("GET", "/history"))

    def episode(self, instruction: str | None = None, max_ticks: int = 100) -> dict[str, Any]:
        """Run the active policy for one episode on the device's robot."""
        body = {"instruction": instruction, "max_ticks": max_ticks}
        return dict(self._request("POST", "/episode", json=body))

    def rollback(self) -> dict[str, Any]:
        """Back to the previous version."""
        return dict(self._request("POST", "/rollback"))
