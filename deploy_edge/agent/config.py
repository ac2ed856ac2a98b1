"""The device config: one YAML file per device, read by the edge agent at start.

Example (``device.yaml``; relative paths resolve against the file's folder)::

    name: cell-3
    listen: 0.0.0.0:8765            # all interfaces: only with TLS (default 127.0.0.1:8765),
                                    # or allow_plaintext_off_loopback: true
    tls_cert: certs/agent.pem
    tls_key: certs/agent.key
    trusted_keys: [keys/release-2025.pub, keys/release-2026.pub]   # rotate: add, then remove
    tokens:                         # sha256 of each token, by scope (`robo-pipe keys token`)
      read: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]
      deploy: [60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752]
      operate: []                   # a list per scope, so tokens rotate: add, then remove
    target: jetson-orin-nano        # a target profile name or YAML path
    state_dir: /var/lib/robo-pipe   # slots, journal, history, uploads
    driver: my_cell.driver:open_arm # module:callable(cameras, image_size) -> robots.Robot
    lock_file: /run/robot-busy      # while it exists, a new version is staged, not activated
    max_release_mb: 4096            # uploads and extraction never write more per release
    stalled_client_s: 10            # WS /policy: a client that stops reading is closed this soon
"""

from __future__ import annotations

import functools
import hmac
import inspect
import ipaddress
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import robots.interface
from deploy_edge.keys import load_public_key
from robo_pipe.errors import RoboPipeError
from robo_pipe.validation import first_error, read_mapping
from robots.interface import DriverError, DriverFactory

Scope = Literal["read", "deploy", "operate"]
"""What a bearer token may do on the agent."""
SCOPES: tuple[Scope, ...] = ("read", "deploy", "operate")
"""The scopes in order: each allows everything the ones before it allow. ``read``: status,
history, the list of uploads. ``deploy``: upload, deploy, activate, roll back, delete an upload.
``operate``: what moves the robot or overrides a rule (``/episode``, ``WS /policy``, a
deployment with ``force``)."""


def allows(granted: Scope, needed: Scope) -> bool:
    """Whether a token of scope ``granted`` may do what ``needed`` guards (the order of
    :data:`SCOPES`)."""
    return SCOPES.index(granted) >= SCOPES.index(needed)


class DeviceConfigError(RoboPipeError, ValueError):
    """A device config file is missing or invalid; the message names the file, field and value."""


def _hex_sha256(value: str) -> str:
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value.lower()):
        raise ValueError(f"{value!r}: expected 64 hex digits (sha256 of the token)")
    return value.lower()


class Tokens(BaseModel):
    """The bearer tokens the agent accepts, by scope: hex sha256 of each (never the token).
    Each scope is a list, so a token rotates: add the new hash, move clients, remove the old."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    read: list[str] = []
    deploy: list[str] = []
    operate: list[str] = []

    @field_validator("read", "deploy", "operate")
    @classmethod
    def _hashes(cls, value: list[str]) -> list[str]:
        return [_hex_sha256(v) for v in value]

    @model_validator(mode="after")
    def _some_token(self) -> Tokens:
        if not (self.read or self.deploy or self.operate):
            raise ValueError("no token in any scope: the agent would refuse every call")
        return self

    def scope_of(self, token_sha256: str) -> Scope | None:
        """The highest scope whose list holds ``token_sha256``, or None. Every hash is compared
        in constant time (the answer's timing does not tell how much of a hash matched)."""
        found: Scope | None = None
        for scope in SCOPES:
            for known in getattr(self, scope):
                if hmac.compare_digest(known, token_sha256):
                    found = scope
        return found


class DeviceConfig(BaseModel):
    """What the edge agent on one device needs (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    """The device's name (in status answers and deployment records)."""
    listen: str = "127.0.0.1:8765"
    """``host:port`` the agent's HTTP service (and its policy server, ``WS /policy``) binds.
    Loopback unless named otherwise; any other address needs ``tls_cert`` and ``tls_key``
    (the bearer token and the robot's camera images must not cross a network in clear), or
    ``allow_plaintext_off_loopback``."""
    allow_plaintext_off_loopback: bool = False
    """Serve plain HTTP on a non-loopback ``listen`` anyway: the tokens and camera images cross
    the network in clear (a closed lab network, or TLS ended by a proxy on the device); the
    agent logs a warning at start."""
    trusted_keys: list[Path] = []
    """Public key files a release may be signed with (a list, so keys rotate); empty = accepts
    no release."""
    tokens: Tokens
    """Hex sha256 of the bearer tokens clients present, by scope (:class:`Tokens`,
    :data:`SCOPES`)."""
    target: str = "local-cpu"
    """Target profile: a name in ``configs/targets`` or a YAML path."""
    state_dir: Path
    """Slots, the journal, the history and the uploads."""
    driver: str = "sim_scenes.sim_robot:simulated_rp5"
    """``module:callable``, called as ``callable(cameras, image_size, **driver_args) -> Robot``."""
    driver_args: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Keyword arguments of the driver after the policy's cameras and image size (the generic
    simulated one, ``sim_scenes.sim_robot:simulated``, takes ``task`` and ``seed``)."""
    instruction: str = "touch the red cube"
    """Instruction of the latency gate and the health check."""
    gate_steps: int = Field(default=200, ge=1)
    gate_warmup: int = Field(default=20, ge=0)
    pace: bool = True
    """Pace the gate and the health check to the control rate (off: back to back)."""
    health_ticks: int = Field(default=30, ge=1)
    """Control ticks of the health check after activation."""
    shadow_health: bool = False
    """Run the health check in shadow mode: observations in, actions computed, never sent to
    the robot (what a real arm wants; the simulated one may move)."""
    lock_file: Path | None = None
    """Robot-busy lock: while this file exists, a verified version is staged, not activated."""
    tls_cert: Path | None = None
    """PEM certificate the agent serves HTTPS and WSS with (with ``tls_key``)."""
    tls_key: Path | None = None
    max_release_mb: float = Field(default=4096.0, gt=0)
    """Largest release this device accepts, MiB: an upload declaring more is refused before a
    byte is written, and extraction never writes more (a 256M-parameter VLA's release with its
    INT8 variant is ~1.2 GiB)."""
    free_space_margin_mb: float = Field(default=512.0, ge=0)
    """An upload is refused when, once complete, it would leave less than this much free on the
    state directory's disk, MiB (the slots, journal and logs still need room)."""
    upload_max_age_h: float = Field(default=24.0, gt=0)
    """A partial upload untouched for this many hours is deleted (at start and before each new
    upload)."""
    stalled_client_s: float = Field(default=10.0, gt=0)
    """A policy-server client (``WS /policy``) that stops reading is closed within this many
    seconds: the agent pings each client every half of it and closes one whose answer (pong)
    has not come back after the other half; a robot whose client reads its chunks answers in
    milliseconds."""

    @model_validator(mode="before")
    @classmethod
    def _no_single_token(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token_sha256" in data:
            raise ValueError(
                "field 'token_sha256' was replaced by 'tokens' (scoped: read < deploy < "
                "operate); to keep that token's powers write 'tokens: {operate: [<the same "
                "hash>]}', or mint one per scope with `robo-pipe keys token --scope deploy`"
            )
        return data

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        _, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected host:port")
        return value

    @model_validator(mode="after")
    def _tls_off_loopback(self) -> DeviceConfig:
        if self.plaintext_off_loopback and not self.allow_plaintext_off_loopback:
            raise ValueError(
                f"field 'listen' = {self.listen!r}: a non-loopback address needs tls_cert and "
                "tls_key (the token and camera images would cross the network in clear); "
                "set both, listen on 127.0.0.1, or accept plaintext with "
                "allow_plaintext_off_loopback: true"
            )
        return self

    @property
    def plaintext_off_loopback(self) -> bool:
        """Whether the agent serves plain HTTP on an address other machines reach."""
        return not is_loopback(self.listen) and (self.tls_cert is None or self.tls_key is None)

    @field_validator("driver")
    @classmethod
    def _import_path(cls, value: str) -> str:
        module, sep, attr = value.partition(":")
        if not (sep and module and attr):
            raise ValueError("expected an import path module:callable")
        return value


def is_loopback(listen: str) -> bool:
    """Whether ``host:port`` binds only this machine: ``localhost``, ``127.x.x.x`` or ``::1``
    (an empty host is served as 127.0.0.1)."""
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


_PATH_FIELDS = ("state_dir", "lock_file", "tls_cert", "tls_key")


def load_device_config(path: str | Path) -> DeviceConfig:
    """The device config in ``path``; relative paths in it resolve against its folder.

    Raises :class:`DeviceConfigError` naming the file, field and value."""
    file = Path(path)
    data = read_mapping(file, "device config file", DeviceConfigError)
    base = file.resolve().parent
    resolved: dict[str, Any] = dict(data)
    for field in _PATH_FIELDS:
        if isinstance(resolved.get(field), str):
            resolved[field] = base / resolved[field]
    if isinstance(resolved.get("trusted_keys"), list):
        resolved["trusted_keys"] = [
            base / k if isinstance(k, str) else k for k in resolved["trusted_keys"]
        ]
    target = resolved.get("target")
    if isinstance(target, str) and target.endswith((".yaml", ".yml")):
        resolved["target"] = str(base / target)
    try:
        config = DeviceConfig.model_validate(resolved)
    except ValidationError as err:
        raise DeviceConfigError(first_error(file, err)) from err
    if (config.tls_cert is None) != (config.tls_key is None):
        raise DeviceConfigError(f"{file}: field 'tls_cert'/'tls_key': give both or neither")
    return config


def check_device_files(config: DeviceConfig) -> None:
    """Load every file the agent serves with, before it listens: each trusted key (an Ed25519
    public key), the TLS certificate and its key, and the two together (the key must be the
    certificate's). :class:`DeviceConfigError` naming the field and the file otherwise (an
    agent that starts with a broken trust store would refuse every release, or fail the first
    TLS handshake, long after whoever configured it has gone)."""
    for path in config.trusted_keys:
        try:
            load_public_key(path)
        except RoboPipeError as err:
            raise DeviceConfigError(f"field 'trusted_keys': {err}") from err
    if config.tls_cert is None or config.tls_key is None:
        return
    checks: list[tuple[str, Path, str, Callable[[bytes], object]]] = [
        ("tls_cert", config.tls_cert, "certificate", x509.load_pem_x509_certificate),
        ("tls_key", config.tls_key, "private key", _unencrypted_private_key),
    ]
    for field, path, what, parse in checks:
        try:
            parse(path.read_bytes())
        except OSError as err:
            raise DeviceConfigError(f"field {field!r}: {path}: {err.strerror}") from err
        except (ValueError, TypeError) as err:  # TypeError: an encrypted key
            raise DeviceConfigError(f"field {field!r}: {path}: not a PEM {what} ({err})") from err
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            config.tls_cert, config.tls_key
        )
    except ssl.SSLError as err:
        raise DeviceConfigError(
            f"field 'tls_key': {config.tls_key} does not serve {config.tls_cert} ({err.reason})"
        ) from err


def _unencrypted_private_key(data: bytes) -> object:
    return serialization.load_pem_private_key(data, password=None)


def load_driver(import_path: str, args: Mapping[str, object] | None = None) -> DriverFactory:
    """The driver factory the config's ``driver`` field names
    (:func:`robots.interface.load_driver`) with its ``driver_args`` bound;
    :class:`DeviceConfigError` if it cannot be imported or does not take those arguments."""
    try:
        factory = robots.interface.load_driver(import_path)
    except DriverError as err:
        raise DeviceConfigError(f"field 'driver' = {err}") from err
    if not args:
        return factory
    try:
        inspect.signature(factory).bind(("scene",), 64, **args)
    except TypeError as err:
        raise DeviceConfigError(
            f"field 'driver_args' = {dict(args)}: {import_path} does not take them ({err})"
        ) from err
    except ValueError:  # no signature to check (a builtin): calling it will tell
        pass
    return functools.partial(factory, **args)
