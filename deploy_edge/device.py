"""A device that releases are deployed to: the :class:`Device` interface, the devices-file entry
that names one, and the one place that picks a device's implementation by its kind.

A devices file (YAML)::

    devices:
      - name: lab-jetson-03
        kind: agent                        # optional (the default): how it is reached, see KINDS
        url: https://lab-jetson-03.local:8765
        token_env: LAB_JETSON_03_TOKEN     # the bearer token is read from this variable
        target: jetson-orin-nano           # its target profile (configs/targets/)
        ca_cert: certs/lab-ca.pem          # optional: trust this CA for the agent's TLS

The deploy code (``pipelines.deploy``) opens a device with :func:`connect` and talks to it
through :class:`Device` only. A new kind of device (a ROS 2 robot, another transport) is one
class implementing :class:`Device` in a module of its own, its tests, and one line in
:data:`KINDS`.
"""

from __future__ import annotations

import abc
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from deploy_edge.wire import (
    Deployment,
    DeviceStatus,
    EpisodeResult,
    Health,
    Origin,
    Sent,
    Upload,
)
from robo_pipe.errors import RoboPipeError, ServiceFailure
from robo_pipe.resources import Resource
from robo_pipe.validation import first_error, one_of, read_mapping

KINDS: dict[str, str] = {
    "agent": "deploy_edge.client:AgentClient",  # the HTTP edge agent (deploy_edge.agent)
}
"""Device kind -> ``module:Class`` implementing :class:`Device`. Imported only when a device of
that kind is opened, so a transport's own packages (httpx here; rclpy for a ROS 2 kind) are
needed only where such a device is used."""


class DeviceError(RoboPipeError, ValueError):
    """A device entry is unknown or invalid, its token is not set, or the device cannot be
    reached or refuses the request (the message says which and why). A bad entry, an unset
    token variable or a token the device does not accept is bad input (exit 2); the two
    subclasses below say when the device itself said no or did not answer."""


class DeviceRefused(DeviceError):
    """The device answered and said no (nothing staged, nothing to roll back to, a release not
    on it, a deployment running): a verdict, not bad input; the message carries its reason."""


class DeviceUnreachable(DeviceError, ServiceFailure):
    """The device cannot be reached (no answer, connection refused, TLS failure): a service
    that failed (exit 3); nothing in the input is wrong."""


class DeviceEntry(BaseModel):
    """One device of a devices file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    kind: Annotated[str, AfterValidator(one_of(KINDS, "device kind"))] = "agent"
    """How the device is reached: a key of :data:`KINDS`."""
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
    """The entry ``name`` of the devices file at ``path``; errors name the file, field and
    value."""
    try:
        parsed = DevicesFile.model_validate(read_mapping(path, "devices file", DeviceError))
    except ValidationError as err:
        raise DeviceError(first_error(path, err)) from err
    found = {d.name: d for d in parsed.devices}
    if name not in found:
        raise DeviceError(f"{path}: no device {name!r}; devices: {', '.join(found) or 'none'}")
    entry = found[name]
    if entry.ca_cert is not None and not entry.ca_cert.is_absolute():
        entry = entry.model_copy(update={"ca_cert": path.parent / entry.ca_cert})
    return entry


class Device(Resource):
    """One edge device as the deploying machine sees it: what it runs, a release sent to it
    and deployed there (verified, built, gated, activated and health-checked on the device),
    rollback, and an episode of the active policy on its robot.

    Open one with :func:`connect` and close it after use (it is a context manager). Every
    method raises :class:`DeviceError` when the device cannot be reached
    (:class:`DeviceUnreachable`) or refuses (:class:`DeviceRefused`; the message names the
    device and why); the answers are the records of
    :mod:`deploy_edge.wire`, whatever the transport.

    Not yet: streaming actions (the robot's observations in, action chunks out at the control
    rate) for a policy served off the device; it will be a method here.
    """

    def __init__(self, entry: DeviceEntry, timeout_s: float = 30.0) -> None:
        """Open the connection to ``entry``'s device; a request waits ``timeout_s`` at most."""
        self.entry, self.timeout_s = entry, timeout_s

    @abc.abstractmethod
    def health(self) -> Health:
        """Whether the device answers (no credentials needed)."""

    @abc.abstractmethod
    def status(self) -> DeviceStatus:
        """Its active, previous and staged version, the robot-busy lock, and its running and
        last deployment."""

    @abc.abstractmethod
    def history(self) -> list[Deployment]:
        """Every deployment on the device, newest first."""

    @abc.abstractmethod
    def upload(
        self,
        release: Path,
        sha256: str,
        on_progress: Callable[[int, int], None] | None = None,
        delta: bool = True,
    ) -> Sent:
        """Send the signed release file ``release`` (its ``sha256``): only what the device
        lacks (``delta``; else the whole file), resuming from what it already has;
        ``on_progress(sent, to_send)`` in bytes. What was sent."""

    @abc.abstractmethod
    def uploads(self) -> list[Upload]:
        """Every upload on the device, partial or complete, oldest first."""

    @abc.abstractmethod
    def delete_upload(self, sha256: str) -> Upload:
        """Delete the upload ``sha256``, partial or complete (refused while it is being
        written or deployed); the upload as it was."""

    @abc.abstractmethod
    def deploy(
        self,
        sha256: str,
        force: bool = False,
        on_status: Callable[[DeviceStatus], None] | None = None,
        timeout_s: float = 1800.0,
        systems_test: bool = False,
        origin: Origin | None = None,
    ) -> Deployment:
        """Deploy the uploaded release ``sha256`` and follow it to its end within
        ``timeout_s``; ``on_status`` sees the device's status as the steps go. ``force``
        allows a downgrade or an expired release (the device records it); ``systems_test``
        a random-weights release (systems measurements only; the device records it too);
        ``origin`` who asks (recorded on the deployment in the device's history).
        The answer is the device's record of this deployment: ``state`` ``active`` only when
        it now runs it, ``variant`` what of the bundle runs and, with ``precision: auto``,
        ``trials`` and ``choice`` why."""

    @abc.abstractmethod
    def activate(self, origin: Origin | None = None) -> Deployment:
        """Activate the staged version now (activate, health check, commit); a
        :class:`DeviceRefused` when nothing is staged or the robot-busy lock is still set."""

    @abc.abstractmethod
    def rollback(self, release: int | None = None, origin: Origin | None = None) -> Deployment:
        """Back to the previous version, which becomes active; the device's next rollback
        target is never the version rolled back from (the rule:
        :meth:`deploy_edge.agent.deployer.Deployer.rollback`). ``release``: only if the
        previous version is that release, else :class:`DeviceRefused` (naming what the device
        holds); ``origin``: who asks (recorded)."""

    @abc.abstractmethod
    def unstage(self, origin: Origin | None = None) -> Deployment:
        """Drop the staged version (deleted from the device, never activated); its deployment
        record, now ``unstaged``. :class:`DeviceRefused` when nothing is staged."""

    @abc.abstractmethod
    def episode(self, instruction: str | None = None, max_ticks: int = 100) -> EpisodeResult:
        """One episode of the active policy on the device's robot (``instruction`` None: the
        task the robot's scene poses), at most ``max_ticks`` control ticks."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection."""


def connect(entry: DeviceEntry, timeout_s: float = 30.0) -> Device:
    """The :class:`Device` for ``entry``: the class its kind names in :data:`KINDS`."""
    kind: type[Device] = pkgutil.resolve_name(KINDS[entry.kind])
    return kind(entry, timeout_s)
