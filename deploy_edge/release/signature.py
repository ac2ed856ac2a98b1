"""A release's signature (``manifest.sig``): signing a bundle into a release, verifying one.

:func:`write_release` writes the manifest of an export bundle, signs its exact bytes with an
Ed25519 key (named by :func:`deploy_edge.keys.key_id`) and packs manifest, signature and bundle
into the release file; :func:`verify_release` checks that a release's signature is by one of a
device's trusted keys and covers its manifest as it is in the file (Mender's signed artifacts).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deploy_edge.bundle.files import bundle_files
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.keys import key_id
from deploy_edge.release.header import (
    BUNDLE_DIR,
    MANIFEST_FILE,
    SIGNATURE_ALGORITHM,
    SIGNATURE_FILE,
    ReleaseError,
    metadata_members,
    open_tar,
    read_metadata,
)
from deploy_edge.release.manifest import (
    Manifest,
    as_utc,
    iso_utc,
    parse_manifest,
    signed_bytes,
)
from robo_pipe.errors import InputError
from robo_pipe.integrity import file_sha256


def write_release(
    export_dir: Path,
    out: Path,
    private_key: Ed25519PrivateKey,
    *,
    model_name: str,
    model_version: str,
    run_id: str,
    release: int,
    targets: Sequence[str] = (),
    budget_ms: float | None = None,
    expires_in_days: float | None = 30.0,
    now: datetime | None = None,
    gated: tuple[str, float] | None = None,
) -> Manifest:
    """Sign the export bundle at ``export_dir`` into the release file ``out`` and return its
    manifest.

    ``release``: the release number (>= 0, higher than every earlier release of the model);
    ``targets``: target profile names it may run on (empty: any); ``budget_ms``: the latency
    budget, ms; ``expires_in_days``: days from ``now`` (default: the current time, UTC; a naive
    datetime is taken as UTC) until devices refuse it, None for never; ``gated``: the target
    profile the pipeline's latency gate ran on and the inference p99 it measured, ms (the
    manifest's ``gated_target``, ``gated_inference_ms``).

    ``out`` is written beside itself and renamed into place: it is replaced whole or not at
    all. Refuses a bundle :func:`~deploy_edge.bundle.files.bundle_files` refuses
    (:class:`~deploy_edge.bundle.io_spec.IOSpecError`), a bundle file that changes while it is
    written (:class:`ReleaseError` ``corrupt``) and bad arguments (:class:`InputError`).
    """
    source, target = Path(export_dir), Path(out)
    if type(release) is not int or release < 0:
        raise InputError(f"release number {release!r}: expected an integer >= 0")
    for field, value in (("model_name", model_name), ("model_version", model_version)):
        if not isinstance(value, str) or not value:
            raise InputError(f"{field} {value!r}: expected a non-empty string")
    if expires_in_days is not None and not expires_in_days > 0:
        raise InputError(f"expires_in_days {expires_in_days!r}: expected a number > 0 (or None)")
    if budget_ms is not None and not budget_ms > 0:
        raise InputError(f"budget_ms {budget_ms!r}: expected a number > 0 (or None)")
    if target.is_dir():
        raise InputError(f"{target}: is a directory, expected a release file path")
    files = bundle_files(source)
    spec = read_io_spec(source)
    created = as_utc(now)
    manifest = Manifest(
        model_name=model_name,
        model_version=model_version,
        run_id=run_id,
        release=release,
        files={rel.as_posix(): file_sha256(source / rel) for rel in files},
        sizes={rel.as_posix(): (source / rel).stat().st_size for rel in files},
        io_spec=spec,
        targets=list(targets),
        budget_ms=None if budget_ms is None else float(budget_ms),
        created_at=iso_utc(created),
        expires_at=None
        if expires_in_days is None
        else iso_utc(created + timedelta(days=expires_in_days)),
        key_id=key_id(private_key.public_key()),
        gated_target=gated[0] if gated else None,
        gated_inference_ms=float(gated[1]) if gated else None,
    )
    manifest_bytes = signed_bytes(manifest)
    signature = {
        "algorithm": SIGNATURE_ALGORITHM,
        "key_id": manifest.key_id,
        "signature": base64.b64encode(private_key.sign(manifest_bytes)).decode("ascii"),
    }
    signature_bytes = (json.dumps(signature, indent=1) + "\n").encode()
    mtime = int(created.timestamp())

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    temp = Path(temp_name)
    try:
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            tar.addfile(
                _tarinfo(MANIFEST_FILE, len(manifest_bytes), mtime), io.BytesIO(manifest_bytes)
            )
            tar.addfile(
                _tarinfo(SIGNATURE_FILE, len(signature_bytes), mtime), io.BytesIO(signature_bytes)
            )
            for rel in files:
                name = rel.as_posix()
                with (source / rel).open("rb") as data:
                    size = os.fstat(data.fileno()).st_size
                    if size != manifest.sizes[name]:
                        raise ReleaseError(
                            "corrupt", f"{source / rel}: changed while the release was written"
                        )
                    reader = _HashingReader(data)
                    tar.addfile(_tarinfo(f"{BUNDLE_DIR}/{name}", size, mtime), reader)
                if reader.hexdigest() != manifest.files[name] or reader.read_bytes != size:
                    raise ReleaseError(
                        "corrupt", f"{source / rel}: changed while the release was written"
                    )
            raw.flush()
            os.fsync(raw.fileno())
        temp.chmod(0o644)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return manifest


def verify_release(file: Path, trusted: Sequence[Ed25519PublicKey]) -> Manifest:
    """The manifest of the release ``file`` once its signature is checked against the
    ``trusted`` public keys.

    Refuses with :class:`ReleaseError` and the reason: ``no-trusted-keys`` (``trusted`` is
    empty: a device without keys installs nothing), ``corrupt`` (not a readable tar file, or a
    manifest/signature member duplicated or too large), ``bad-format`` (no manifest, or one of
    another format, a newer version or invalid fields), ``unsigned`` (no signature member),
    ``untrusted-key`` (signed by a key not in ``trusted``), ``bad-signature`` (the signature
    does not verify: the manifest was edited after signing, or the signature is malformed),
    ``unsafe-path`` (the manifest lists a file outside the bundle).

    Does not look at the bundle files (:func:`deploy_edge.release.payload.extract_release` hashes
    them) nor at expiry and release number (:func:`deploy_edge.release.manifest.check_policy`).
    """
    if not trusted:
        raise ReleaseError(
            "no-trusted-keys", f"{file}: no trusted public keys configured; refusing to install"
        )
    with open_tar(file) as tar:
        members = metadata_members(file, tar)
        manifest_bytes = read_metadata(file, tar, members, MANIFEST_FILE)
        signature_bytes = read_metadata(file, tar, members, SIGNATURE_FILE)
    if manifest_bytes is None:
        raise ReleaseError("bad-format", f"{file}: not a robo-pipe release (no {MANIFEST_FILE})")
    if signature_bytes is None:
        raise ReleaseError("unsigned", f"{file}: unsigned release (no {SIGNATURE_FILE})")
    signer, signature = _parse_signature(file, signature_bytes)
    keys = {key_id(key): key for key in trusted}
    if signer not in keys:
        raise ReleaseError(
            "untrusted-key",
            f"{file}: signed by key {signer!r}, which is not trusted here "
            f"(trusted: {', '.join(sorted(keys))})",
        )
    try:
        keys[signer].verify(signature, manifest_bytes)
    except InvalidSignature as err:
        raise ReleaseError(
            "bad-signature",
            f"{file}: the signature of {MANIFEST_FILE} by key {signer} does not verify "
            "(edited after signing?)",
        ) from err
    manifest = parse_manifest(file, manifest_bytes)
    if manifest.key_id != signer:
        raise ReleaseError(
            "bad-signature",
            f"{file}: {MANIFEST_FILE} names key {manifest.key_id} but was signed by {signer}",
        )
    return manifest


def _tarinfo(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.type = size, mtime, 0o644, tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _HashingReader(io.RawIOBase):
    """A read-only view of ``source`` that hashes what is read (the tar writer reads the file
    once; the manifest's hash must be of the bytes that went into the tar)."""

    def __init__(self, source: IO[bytes]) -> None:
        super().__init__()
        self._source = source
        self._digest = hashlib.sha256()
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._source.read(size)
        self._digest.update(data)
        self.read_bytes += len(data)
        return data

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def _parse_signature(file: Path, data: bytes) -> tuple[str, bytes]:
    """``(key id, raw signature)`` of ``manifest.sig``."""
    where = f"{file}: {SIGNATURE_FILE}"
    try:
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ReleaseError("bad-signature", f"{where}: not valid JSON ({err})") from err
    if not isinstance(parsed, dict):
        raise ReleaseError("bad-signature", f"{where}: expected a JSON object")
    algorithm, signer, encoded = (parsed.get(k) for k in ("algorithm", "key_id", "signature"))
    if algorithm != SIGNATURE_ALGORITHM:
        raise ReleaseError(
            "bad-signature",
            f"{where}: field 'algorithm' = {algorithm!r}: expected {SIGNATURE_ALGORITHM!r}",
        )
    if not isinstance(signer, str) or not isinstance(encoded, str):
        raise ReleaseError("bad-signature", f"{where}: fields 'key_id' and 'signature' missing")
    try:
        signature = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ReleaseError("bad-signature", f"{where}: field 'signature' is not base64") from err
    return signer, signature
