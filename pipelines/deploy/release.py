"""Releases: a registry version as a signed release, and that release on a device.

    bundle_release(version, key) -> (Manifest, release file)   (reused while valid)
    runs_release(slot, manifest, sha256) -> bool                 (the device runs it already)
    already_running(device, manifest, sha256) -> Deployment?     (then: nothing to send)
    deploy_release(entry, release) -> (Deployment, Sent)        (upload, then the device's steps)

The CLI verbs, the local agent's deploy stage and the fleet rollout call these and report
progress to a :class:`~pipelines.progress.Listener`; the device does the verifying, building,
gating and activating itself (:mod:`deploy_edge.agent`). The version arrives typed, as a
:class:`RegisteredVersion`: the register step's record, or the
:class:`~pipelines.registry.versions.VersionInfo` that the CLI resolved once from a
``models:/`` string.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pipelines.home import home_dir
from pipelines.progress import SILENT, Listener
from pipelines.registry.exports import fetch_export
from pipelines.registry.tags import DEVICE_TAG, GATED_TARGET_TAG, INFERENCE_P99_TAG
from pipelines.registry.versions import RegistryError, set_version_tags
from robo_pipe.locks import output_lock

if TYPE_CHECKING:
    from deploy_edge.device import Device, DeviceEntry
    from deploy_edge.release.manifest import Manifest
    from deploy_edge.wire import Deployment, DeviceStatus, Origin, Sent, Slot, StepResult


class RegisteredVersion(Protocol):
    """A version of a registered model, resolved to its number: a
    :class:`~pipelines.registry.versions.VersionInfo` or the register step's
    :class:`~pipelines.records.Registration`."""

    @property
    def name(self) -> str:
        """The registered model's name."""

    @property
    def version(self) -> str:
        """The version number (never an alias)."""


def device_tags(device: str, **fields: str) -> dict[str, str]:
    """``fields`` (``version="name:N"``, ``state="active"``, ...) as ``device``'s tags (under
    :data:`~pipelines.registry.tags.DEVICE_TAG`)."""
    return {f"{DEVICE_TAG}{device}.{field}": value for field, value in fields.items()}


def variant_tags(device: str, done: Deployment) -> dict[str, str]:
    """What of the bundle runs on ``device`` after ``done`` (``variant``), why (``choice``:
    with ``precision: auto``, the choice and each other option's reason), and whether the
    deploy was a systems test, as ``device``'s tags; none for a deployment that never built
    an engine."""
    if not done.variant:
        return {}
    why = [done.choice] if done.choice else []
    why += [f"{t.variant}: {t.failure}" for t in done.trials if not t.chosen and t.failure]
    fields = {"variant": done.variant, "choice": "; ".join(why)[:4000] or "pinned"}
    if done.systems_test:
        fields["systems_test"] = "true"
    return device_tags(device, **fields)


def mark_replaced(device: str, left: str, new: str, at: str) -> str:
    """Tag the version ``device`` left (``left``: ``name:N``) as replaced there by ``new``;
    why it could not be tagged (a version since deleted, a registry error), or ``""``."""
    from mlflow.exceptions import MlflowException

    name, _, version = left.rpartition(":")
    tags = device_tags(device, version=new, state="replaced", at=at)
    try:
        set_version_tags(name, version, tags)
    except (RegistryError, MlflowException) as err:
        return f"could not tag {left}: {err}"
    return ""


def utc_stamp() -> str:
    """Now, UTC, to the second (``2026-11-26T10:16:01Z``): when a device's state was read."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_key() -> Path:
    """The signing key ``robo-pipe keys generate`` writes by default."""
    return home_dir("keys") / "robo-pipe.key"


def signing_key() -> Path:
    """The home's default signing key, generated (with its public key) on first use."""
    from deploy_edge.keys import generate_keypair

    key = default_key()
    with output_lock(key, "keys"):  # two first runs at once must not make two key pairs
        if not key.is_file():
            generate_keypair(key.parent, key.stem)
    return key


def bundle_release(
    version: RegisteredVersion,
    key: Path,
    out: Path | None = None,
    expires_in_days: float | None = 30.0,
    targets: Sequence[str] = (),
    budget_ms: float | None = None,
) -> tuple[Manifest, Path]:
    """The registry version ``version`` as a release signed with ``key``: its export bundle
    with a manifest (model, version, run, every file's sha256, the I/O spec, ``targets``,
    ``budget_ms``, expiry) and the release number for anti-rollback, which is the registry
    version number (a newer version is a newer release). An earlier release of the same
    version with the same key is reused while it verifies and has not expired; a new one is
    signed only over a bundle that verifies against its checksums
    (:func:`deploy_edge.bundle.files.verify_bundle`)."""
    from deploy_edge.bundle.files import verify_bundle
    from deploy_edge.keys import key_id, load_private_key
    from deploy_edge.release.header import ReleaseError
    from deploy_edge.release.manifest import check_policy
    from deploy_edge.release.signature import verify_release, write_release

    private = load_private_key(key)
    info, export_dir = fetch_export(version.name, version.version)
    gated = gated_figure(info.tags)
    signer = key_id(private.public_key())
    target = out or home_dir("releases") / f"{version.name}-v{version.version}-{signer}.release"
    if target.is_file():
        try:
            manifest = verify_release(target, [private.public_key()])
            check_policy(manifest, floor=None)
            recorded = (manifest.gated_target, manifest.gated_inference_ms)
            if (manifest.targets, manifest.budget_ms) == (list(targets), budget_ms) and (
                recorded == (gated or (None, None))
            ):
                return manifest, target
        except ReleaseError:
            pass  # expired or not ours: sign it again
    verify_bundle(export_dir)  # never sign a registry copy that changed since it was fetched
    manifest = write_release(
        export_dir,
        target,
        private,
        model_name=info.name,
        model_version=info.version,
        run_id=info.run_id,
        release=int(info.version),
        targets=targets,
        budget_ms=budget_ms,
        expires_in_days=expires_in_days,
        gated=gated,
    )
    return manifest, target


def gated_figure(tags: Mapping[str, str]) -> tuple[str, float] | None:
    """The target profile a version's latency gate ran on and the inference p99 it measured,
    ms, from its registry tags (None: a version registered before they were recorded)."""
    target, p99 = tags.get(GATED_TARGET_TAG), tags.get(INFERENCE_P99_TAG)
    return (target, round(float(p99), 3)) if target and p99 else None


def runs_release(active: Slot | None, manifest: Manifest, release_sha256: str) -> bool:
    """Whether a device whose active slot is ``active`` already runs the release of
    ``manifest`` (its file's sha256 ``release_sha256``): the same model and version with the
    same bundle content (:attr:`~deploy_edge.release.manifest.Manifest.content_sha256`; for a
    slot recorded before content digests, the same release file). The one check behind every
    "already runs it": ``deploy --device``, a fleet rollout's devices, the demo's local agent.
    The version number alone is not enough: another home's ``demo-policy`` v1 is another
    policy."""
    if active is None:
        return False
    if (active.model_name, active.model_version) != (manifest.model_name, manifest.model_version):
        return False
    if active.content_sha256:
        return active.content_sha256 == manifest.content_sha256
    return active.sha256 == release_sha256


def already_running(device: Device, manifest: Manifest, release_sha256: str) -> Deployment | None:
    """When ``device`` already runs this release (:func:`runs_release`): the deployment that
    made it active, from its history (one made from the active slot when the history no longer
    has it), so that a caller reports the gate it passed and sends nothing. None otherwise."""
    from dataclasses import replace

    from deploy_edge.wire import Deployment

    active = device.status().active
    if active is None or not runs_release(active, manifest, release_sha256):
        return None
    went_live = [
        d for d in device.history() if d.release_sha256 == active.sha256 and d.state == "active"
    ]
    found = went_live[0] if went_live else None
    if found is None:
        found = Deployment(
            "", active.sha256, active.model_name, active.model_version, active.release, "active"
        )
    return replace(found, reason=f"already runs {active.label}: nothing sent")


def deploy_release(
    entry: DeviceEntry,
    release: Path,
    force: bool = False,
    listener: Listener = SILENT,
    timeout_s: float = 1800.0,
    systems_test: bool = False,
    origin: Origin | None = None,
) -> tuple[Deployment, Sent]:
    """Upload ``release`` to ``entry``'s device (only the pieces it lacks; a cut upload
    resumes) and follow the device's steps to the end, all within ``timeout_s``. The device's
    record of the deployment (``state`` is ``active`` only when the device now runs the new
    version) and what the upload sent.
    ``systems_test``: the deploy says it is one, so the device lets a random-weights release
    go live (and records it); ``origin``: who asks (a fleet rollout), kept in its history."""
    from deploy_edge.device import connect
    from robo_pipe.integrity import file_sha256

    sha256, size = file_sha256(release), release.stat().st_size
    shown: set[str] = set()

    def on_upload(sent: int, to_send: int) -> None:
        listener.advanced("upload", sent, f"{sent / 1e6:.1f} / {to_send / 1e6:.1f} MB")

    def show(steps: list[StepResult]) -> None:  # each device step once, as it ends
        for step in steps:
            if step.name not in shown:
                shown.add(step.name)
                verdict = "ok" if step.ok else f"FAILED: {step.detail}"
                listener.finished(step.name, f"{verdict} ({step.seconds:.1f} s)", False)

    def on_status(status: DeviceStatus) -> None:
        show(status.running.steps if status.running else [])

    deadline = time.monotonic() + timeout_s
    with connect(entry, timeout_s=min(30.0, timeout_s)) as device:
        device.health()
        listener.started("upload", size, "bytes")
        sent = device.upload(release, sha256, on_upload)
        listener.finished("upload", sent.summary, reused=False)
        left = max(1.0, deadline - time.monotonic())
        done = device.deploy(
            sha256, force, on_status, timeout_s=left, systems_test=systems_test, origin=origin
        )
        show(done.steps)  # the last steps end after the last poll
        return done, sent
