"""A fleet of edge devices and how a release rolls out to it: a canary first, then waves, with
an abort threshold per wave. Pure: no HTTP, no Prefect (``pipelines.deploy.fleet`` runs the
rollout).

A fleet file (YAML)::

    devices:
      - name: lab-arm-01
        kind: agent                        # optional: see deploy_edge.device.KINDS
        url: https://lab-arm-01.local:8765
        token_env: LAB_ARM_01_TOKEN        # the bearer token is read from this variable
        target: jetson-orin-nano           # its target profile (configs/targets/)
        labels: {site: lab, robot: rp5}    # for --select site=lab
      - ...
    rollout:
      canary: 1               # devices of the first wave; any failure there stops the rollout
      waves: [2, "50%"]       # then waves of these sizes (or shares of the selected devices);
                              # the devices left over join the last wave
      max_failures: 0         # per wave: stop when more devices than this fail ...
      max_failure_pct: null   # ... or more than this share of the wave (either rule stops)
      pause_s: 0              # between waves
      device_timeout_s: 900   # one device's upload and deployment

The devices run in the order of the file: the canary is the first, the waves follow.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deploy_edge.device import DeviceEntry
from robo_pipe.errors import RoboPipeError
from robo_pipe.validation import first_error, read_mapping

_PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class FleetError(RoboPipeError, ValueError):
    """A fleet file is missing or invalid, or a selection is malformed or matches nothing; the
    message names the file, field and value."""


class FleetDevice(DeviceEntry):
    """One device of a fleet: a devices-file entry (:class:`~deploy_edge.device.DeviceEntry`)
    and its labels (site, robot model, ...)."""

    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # the name becomes part of MLflow tag keys and Prefect task-run names
        if not _NAME.match(value):
            raise ValueError(
                "expected letters, digits, '_', '.', '-' (starting with a letter/digit)"
            )
        return value

    @field_validator("labels", mode="before")
    @classmethod
    def _label_text(cls, value: Any) -> Any:
        if isinstance(value, dict):  # site: 3 is the label "3"
            return {
                k: str(v).lower() if isinstance(v, bool) else str(v) if v is not None else v
                for k, v in value.items()
            }
        return value


class RolloutPolicy(BaseModel):
    """How a release rolls out (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    canary: int = Field(default=1, ge=0)
    waves: list[int | str] = []
    """Wave sizes after the canary: a device count or a share of the selected devices
    (``"25%"``, rounded up, at least one device); the remainder joins the last wave."""
    max_failures: int | None = Field(default=None, ge=0)
    max_failure_pct: float | None = Field(default=None, ge=0, le=100)
    pause_s: float = Field(default=0.0, ge=0)
    device_timeout_s: float = Field(default=900.0, gt=0)

    @field_validator("waves")
    @classmethod
    def _sizes(cls, waves: list[int | str]) -> list[int | str]:
        for wave in waves:
            if isinstance(wave, bool):
                raise ValueError(f"wave {wave!r}: expected a device count or 'NN%'")
            if isinstance(wave, int):
                if wave < 1:
                    raise ValueError(f"wave {wave!r}: a wave has at least one device")
                continue
            found = _PERCENT.match(wave.strip())
            if not found or not 0 < float(found.group(1)) <= 100:
                raise ValueError(f"wave {wave!r}: expected a device count or 'NN%' (0 < NN <= 100)")
        return waves


class FleetFile(BaseModel):
    """A fleet file: ``devices: [...]`` and ``rollout: {...}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: list[FleetDevice] = Field(min_length=1)
    rollout: RolloutPolicy = RolloutPolicy()

    @model_validator(mode="after")
    def _unique_names(self) -> FleetFile:
        seen: set[str] = set()
        for device in self.devices:
            if device.name in seen:
                raise ValueError(f"device name {device.name!r} appears twice")
            seen.add(device.name)
        return self


def load_fleet(path: str | Path) -> FleetFile:
    """The fleet file at ``path``; relative ``ca_cert`` paths resolve against its folder.

    Raises :class:`FleetError` naming the file, field and value."""
    file = Path(path)
    data = read_mapping(file, "fleet file", FleetError)
    try:
        fleet = FleetFile.model_validate(data)
    except ValidationError as err:
        raise FleetError(first_error(file, err)) from err
    base = file.resolve().parent
    devices = [
        d.model_copy(update={"ca_cert": base / d.ca_cert})
        if d.ca_cert is not None and not d.ca_cert.is_absolute()
        else d
        for d in fleet.devices
    ]
    return fleet.model_copy(update={"devices": devices})


def select(devices: Sequence[FleetDevice], selectors: Sequence[str]) -> list[FleetDevice]:
    """The devices whose labels match every ``key=value`` selector (``name=...`` matches the
    device's name unless it has a ``name`` label), in file order. No selectors: all of them."""
    wanted: list[tuple[str, str]] = []
    for selector in selectors:
        key, sep, value = selector.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise FleetError(f"--select {selector!r}: expected label=value (e.g. site=lab)")
        wanted.append((key.strip(), value.strip()))

    def matches(device: FleetDevice) -> bool:
        labels = {"name": device.name, **device.labels}
        return all(labels.get(key) == value for key, value in wanted)

    chosen = [d for d in devices if matches(d)]
    if not chosen:
        known = sorted({f"{k}={v}" for d in devices for k, v in d.labels.items()})
        raise FleetError(
            f"--select {' '.join(selectors)}: no device matches; labels: "
            f"{', '.join(known) or 'none'}"
        )
    return chosen


def load_selection(
    fleet: str | Path, selectors: Sequence[str] = ()
) -> tuple[FleetFile, list[FleetDevice]]:
    """The fleet file and the devices ``selectors`` pick (errors: :class:`FleetError`)."""
    parsed = load_fleet(fleet)
    return parsed, select(parsed.devices, list(selectors))


def check_tokens(devices: Sequence[FleetDevice]) -> None:
    """Raise :class:`FleetError` naming every device whose token variable is not set."""
    missing = [f"{d.name} ({d.token_env})" for d in devices if not os.environ.get(d.token_env)]
    if missing:
        raise FleetError(f"token variables not set for: {', '.join(missing)}")


def wave_size(size: int | str, total: int) -> int:
    """A wave's device count: ``size`` itself, or its share of ``total`` devices (rounded up,
    at least one)."""
    if isinstance(size, int):
        return size
    share = float(size.strip().removesuffix("%"))
    return max(1, math.ceil(total * share / 100 - 1e-9))


def canary_size(
    waves: Sequence[Sequence[FleetDevice]], policy: RolloutPolicy, canary_override: int | None
) -> int:
    """Devices in the canary wave (the first of ``waves``) of that plan; 0 without a canary."""
    canary = policy.canary if canary_override is None else canary_override
    return len(waves[0]) if canary and waves else 0


def plan_waves(
    devices: Sequence[FleetDevice], policy: RolloutPolicy, canary_override: int | None = None
) -> list[list[FleetDevice]]:
    """The rollout's waves in order: the canary (the first ``canary`` devices; none with 0),
    then the policy's waves; devices left over join the last wave (one wave of all of them when
    the policy lists none). Every device is in exactly one wave."""
    canary = policy.canary if canary_override is None else canary_override
    if canary < 0:
        raise FleetError(f"--canary {canary}: expected 0 or more devices")
    remaining, total = list(devices), len(devices)
    waves: list[list[FleetDevice]] = []
    if canary:
        waves.append(remaining[:canary])
        remaining = remaining[canary:]
    planned: list[list[FleetDevice]] = []
    for size in policy.waves:
        if not remaining:
            break
        count = wave_size(size, total)
        planned.append(remaining[:count])
        remaining = remaining[count:]
    if remaining:
        if planned:
            planned[-1].extend(remaining)
        else:
            planned.append(remaining)
    return waves + planned


def wave_failed(
    failures: int,
    size: int,
    policy: RolloutPolicy,
    max_failures_override: int | None = None,
    canary: bool = False,
) -> bool:
    """Whether ``failures`` of a wave of ``size`` devices stop the rollout: any failure of the
    canary; else more than ``max_failures_override`` (``--max-failures``) when given, else more
    than the policy's ``max_failures`` or ``max_failure_pct`` of the wave (either rule; neither
    set: any failure)."""
    if failures <= 0:
        return False
    if canary:
        return True
    if max_failures_override is not None:
        return failures > max_failures_override
    if policy.max_failures is None and policy.max_failure_pct is None:
        return True
    if policy.max_failures is not None and failures > policy.max_failures:
        return True
    return policy.max_failure_pct is not None and 100 * failures / max(1, size) > (
        policy.max_failure_pct
    )
