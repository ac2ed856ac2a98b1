"""A release's manifest (``manifest.json``): what a release holds, and the install policy on it.

:class:`Manifest` names the model and release number, the targets, the expiry, the bundle's
I/O spec and the sha256 and size of every bundle file; its exact bytes (:func:`signed_bytes`)
are what the signature covers. :func:`parse_manifest` reads one, refusing another format, an
older or newer version and invalid fields; :func:`read_manifest` reads one from a release
unverified (for display); :func:`check_policy` holds a verified one to the device's install
policy (expiry, the floor: TUF's expiring metadata and no silent downgrade).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deploy_edge.bundle.io_spec import IOSpec
from deploy_edge.release.header import (
    MANIFEST_FILE,
    RELEASE_FORMAT,
    RELEASE_FORMAT_VERSION,
    Reason,
    ReleaseError,
    metadata_members,
    open_tar,
    read_metadata,
    safe_parts,
)
from robo_pipe.records import Record, RecordError

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class Manifest(Record):
    """``manifest.json``: what a release holds, signed as a whole."""

    format: str = RELEASE_FORMAT
    """Always ``robo-pipe-release``."""
    format_version: int = RELEASE_FORMAT_VERSION
    """Raised whenever a reader of an older version would misread the manifest."""
    model_name: str
    """The registered model's name."""
    model_version: str
    """The registered model's version (as the registry spells it)."""
    run_id: str
    """The pipeline run that produced the bundle."""
    release: int
    """Release number, >= 0; only ever grows (a device refuses one below the highest release it
    ever installed of this model, its floor)."""
    files: dict[str, str]
    """Every file of the bundle: bundle-relative POSIX path -> sha256, lowercase hex."""
    sizes: dict[str, int]
    """Every file of the bundle (the paths of ``files``) -> its size, bytes. A device writes no
    more than this per file and refuses a release whose sizes add up past its cap."""
    io_spec: IOSpec
    """The bundle's I/O spec (its ``io_spec.json``, which ``files`` covers too)."""
    targets: list[str]
    """Target profile names the release may run on; empty: any."""
    budget_ms: float | None
    """The latency budget the device's gate applies, ms per inference; None: the target's."""
    created_at: str
    """When the release was signed: ISO 8601, UTC."""
    expires_at: str | None
    """After this (ISO 8601, UTC) a device refuses the release; None: never expires."""
    key_id: str
    """:func:`deploy_edge.keys.key_id` of the key that signed the manifest."""
    gated_target: str | None = None
    """The target profile the pipeline's latency gate measured the policy on (None: not
    recorded)."""
    gated_inference_ms: float | None = None
    """The inference p99 that gate measured, ms (async: inference alone; sync: the whole tick),
    the delay its success at device latency was judged at. A device of that profile whose own
    gate measures more than this plus the profile's ``inference_margin_ms`` refuses the release
    (:func:`deploy_edge.agent.trials.gate`)."""

    @property
    def content_sha256(self) -> str:
        """The bundle's identity: :func:`content_digest` of :attr:`files`."""
        return content_digest(self.files)


def content_digest(files: dict[str, str]) -> str:
    """One sha256 over a bundle's files (bundle-relative path -> sha256): equal exactly when two
    bundles hold the same files with the same bytes, whoever signed them, with whatever expiry,
    targets or budget (which change the release file's own sha256)."""
    lines = "".join(f"{path}\0{sha}\n" for path, sha in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def read_manifest(file: Path) -> Manifest:
    """The manifest of the release ``file``, NOT verified (for display only; install through
    :func:`deploy_edge.release.signature.verify_release`). :class:`ReleaseError` ``corrupt`` /
    ``bad-format`` when it cannot be read."""
    with open_tar(file) as tar:
        members = metadata_members(file, tar)
        data = read_metadata(file, tar, members, MANIFEST_FILE)
    if data is None:
        raise ReleaseError("bad-format", f"{file}: not a robo-pipe release (no {MANIFEST_FILE})")
    return parse_manifest(file, data)


def check_policy(
    manifest: Manifest,
    *,
    floor: int | None,
    now: datetime | None = None,
    force: bool = False,
) -> list[str]:
    """Check a verified manifest against the device's install policy: it must not have expired
    by ``now`` (default: the current time; naive is UTC), and its release number must not be
    below ``floor`` (the highest release of this model the device ever installed, which a
    rollback does not lower; None: none yet). The same release number again is allowed
    (reinstalling the newest).

    Raises :class:`ReleaseError` ``expired`` or ``downgrade`` (``bad-format`` for an unreadable
    ``expires_at``). With ``force`` nothing is raised for those two: the rules overridden are
    returned (e.g. ``["expired"]``; ``[]`` when none was) for the caller to record.
    """
    broken: list[tuple[Reason, str]] = []
    current = as_utc(now)
    if has_expired(manifest.expires_at, current):
        broken.append(
            (
                "expired",
                f"release {manifest.release} of {manifest.model_name} expired at "
                f"{manifest.expires_at} (now {iso_utc(current)})",
            )
        )
    if floor is not None and manifest.release < floor:
        broken.append(
            (
                "downgrade",
                f"release {manifest.release} of {manifest.model_name} is below the device's "
                f"floor {floor}, the highest release of it ever installed (a downgrade; force "
                "to go back on purpose)",
            )
        )
    if broken and not force:
        reason, message = broken[0]
        if len(broken) > 1:
            message += "; and " + "; ".join(m for _, m in broken[1:])
        raise ReleaseError(reason, message)
    return [reason for reason, _ in broken]


def has_expired(expires_at: str | None, now: datetime | None = None) -> bool:
    """Whether a manifest's ``expires_at`` is past by ``now`` (default: the current time; naive
    is UTC); None never expires. :class:`ReleaseError` ``bad-format`` for an unreadable one.
    A device checks it at install (:func:`check_policy`); its status says when the active
    release has expired since."""
    return expires_at is not None and as_utc(now) >= parse_time(expires_at, "expires_at")


def signed_bytes(manifest: Manifest) -> bytes:
    """The exact bytes of ``manifest.json`` (what the signature covers)."""
    return (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode()


def parse_manifest(file: Path, data: bytes) -> Manifest:
    """The manifest in ``data``, the bytes of the release ``file``'s ``manifest.json``;
    ``bad-format`` for invalid JSON, another format, an older or newer ``format_version``, an
    invalid field or a listed path that is not plain (``unsafe-path``)."""
    where = f"{file}: {MANIFEST_FILE}"
    try:
        parsed: Any = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ReleaseError("bad-format", f"{where}: not valid JSON ({err})") from err
    if not isinstance(parsed, dict):
        raise ReleaseError("bad-format", f"{where}: expected a JSON object")
    name, version = parsed.get("format"), parsed.get("format_version")
    if name != RELEASE_FORMAT:
        raise ReleaseError(
            "bad-format", f"{where}: field 'format' = {name!r}: expected {RELEASE_FORMAT!r}"
        )
    if type(version) is not int or version < 1:
        raise ReleaseError(
            "bad-format", f"{where}: field 'format_version' = {version!r}: expected an integer >= 1"
        )
    if version > RELEASE_FORMAT_VERSION:
        raise ReleaseError(
            "bad-format",
            f"{where}: field 'format_version' = {version}: written by a newer robo-pipe; this one "
            f"reads release format version {RELEASE_FORMAT_VERSION}",
        )
    if version < RELEASE_FORMAT_VERSION:
        name, number = parsed.get("model_name"), parsed.get("model_version")
        model = f"models:/{name}/{number}" if isinstance(name, str) else "models:/NAME/VERSION"
        raise ReleaseError(
            "bad-format",
            f"{where}: field 'format_version' = {version}: written by an older robo-pipe, whose "
            f"manifest does not sign the bundle files' sizes; this one reads release format "
            f"version {RELEASE_FORMAT_VERSION}. Sign it again with this robo-pipe: "
            f"robo-pipe bundle {model}",
        )
    try:
        manifest = Manifest.from_json(parsed)
    except RecordError as err:
        raise ReleaseError("bad-format", f"{where}: {err}") from err
    if manifest.release < 0:
        raise ReleaseError("bad-format", f"{where}: field 'release' = {manifest.release}: < 0")
    for rel, digest in manifest.files.items():
        if not _SHA256.fullmatch(digest):
            raise ReleaseError(
                "bad-format", f"{where}: files[{rel!r}] = {digest!r}: not a sha256 (64 hex digits)"
            )
    if set(manifest.sizes) != set(manifest.files):
        odd = sorted(set(manifest.sizes) ^ set(manifest.files))
        raise ReleaseError(
            "bad-format",
            f"{where}: fields 'files' and 'sizes' list different paths: "
            f"{', '.join(map(repr, odd))}",
        )
    for rel, size in manifest.sizes.items():
        if size < 0:
            raise ReleaseError("bad-format", f"{where}: sizes[{rel!r}] = {size}: < 0")
    for field in ("created_at", "expires_at"):
        value = getattr(manifest, field)
        if value is not None:
            parse_time(value, field)
    check_listed_paths(file, manifest)
    return manifest


def check_listed_paths(file: Path, manifest: Manifest) -> None:
    """Every path the manifest lists is a plain relative path, and it lists the model."""
    for rel in manifest.files:
        safe_parts(file, rel, f"{MANIFEST_FILE} lists file")
    model = manifest.io_spec.onnx_file
    if model not in manifest.files:
        raise ReleaseError(
            "bad-format",
            f"{file}: {MANIFEST_FILE}: io_spec.onnx_file = {model!r} is not among its files",
        )


def as_utc(moment: datetime | None) -> datetime:
    """``moment`` in UTC (naive is taken as UTC); None: the current time."""
    if moment is None:
        return datetime.now(UTC)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def iso_utc(moment: datetime) -> str:
    """``moment`` as the manifest writes times: ISO 8601 to the second, UTC, ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_time(value: str, field: str) -> datetime:
    """The time the manifest's ``field`` holds (``value``), UTC; ``bad-format`` unless ISO
    8601."""
    try:
        return as_utc(datetime.fromisoformat(value))
    except (TypeError, ValueError) as err:
        raise ReleaseError(
            "bad-format", f"{MANIFEST_FILE}: field {field!r} = {value!r}: not an ISO 8601 time"
        ) from err
