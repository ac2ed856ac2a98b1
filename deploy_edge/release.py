"""Signed releases: one file that carries an export bundle and a signed manifest of it.

A release is an uncompressed tar file whose members are, in this order::

    manifest.json      the :class:`Manifest`: model, release number, targets, expiry, the
                       bundle's I/O spec and the sha256 and size of every bundle file
    manifest.sig       the Ed25519 signature of the exact bytes of manifest.json, as JSON:
                       {"algorithm": "ed25519", "key_id": ..., "signature": <base64>}
    bundle/<files>     the export bundle (:func:`deploy_edge.bundle.bundle_files`)

An edge device installs one in three steps, each its own function so that the agent can record
which one refused:

1. :func:`verify_release`: the signature is by one of the device's trusted keys and covers the
   manifest as it is in the file (Mender's signed artifacts);
2. :func:`check_policy`: the release has not expired and is not below the device's floor, the
   highest release it ever installed (TUF: expiring metadata, no silent downgrade, a rollback
   does not lower the bar); ``force`` overrides and reports what it overrode;
3. :func:`extract_release`: unpacks into a fresh directory, accepting only regular files inside
   ``bundle/`` whose sha256 the manifest lists (PEP 706's ``data`` filter plus checks of its
   own), none missing and none extra, and a model whose external data stays inside the bundle
   (the ONNX external-data path traversal CVEs).

What a release can write to a device's disk is bounded by its signature: the manifest signs
every bundle file's size, a member whose tar header says otherwise is refused before a byte of
it is written, the copy stops at the declared size, and the sizes must add up to no more than
the device's cap. Compressed releases are refused (a few KiB of gzip can unpack to GiB): the
file's own size bounds what it unpacks to.

Every refusal is a :class:`ReleaseError` whose ``reason`` is a short code the agent reports and
whose message names the file, member or value. Uses the standard library, ``cryptography`` and
(to read the model's external data references) ``onnx``; nothing of the training stack.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import IO, Any, Final, Literal, get_args

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deploy_edge.bundle import IOSpec, IOSpecError, bundle_files, read_io_spec
from deploy_edge.keys import key_id
from robo_pipe.errors import InputError, RoboPipeError
from robo_pipe.integrity import file_sha256
from robo_pipe.records import Record, RecordError

RELEASE_FORMAT = "robo-pipe-release"
"""The manifest's ``format``: what kind of file this is."""
RELEASE_FORMAT_VERSION = 2
"""The manifest ``format_version`` this robo-pipe writes and reads (2: ``sizes``, every bundle
file's size, signed). Older ones are refused with a hint to sign the release again."""
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
BUNDLE_DIR = "bundle"
"""The tar directory (and the directory :func:`extract_release` returns) holding the bundle."""

SIGNATURE_ALGORITHM = "ed25519"

Reason = Literal[
    "no-trusted-keys",
    "unsigned",
    "untrusted-key",
    "bad-signature",
    "bad-format",
    "hash-mismatch",
    "missing-file",
    "extra-file",
    "unsafe-path",
    "unsafe-member",
    "external-data-outside",
    "expired",
    "downgrade",
    "corrupt",
    "too-large",
    "size-mismatch",
]
REASONS: Final = frozenset(get_args(Reason))
"""Every :attr:`ReleaseError.reason`."""

_MAX_METADATA_BYTES = 16 << 20
"""Largest manifest.json / manifest.sig read into memory, bytes."""
_CHUNK = 1 << 20
_COMPRESSED: Final = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
"""The magic bytes a compressed file starts with -> its compression (for the refusal's message;
the tar is opened ``r:``, which never decompresses)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ReleaseError(RoboPipeError, ValueError):
    """A release is refused. ``reason`` is a short machine-readable code (one of
    :data:`REASONS`): ``no-trusted-keys``, ``unsigned``, ``untrusted-key``, ``bad-signature``,
    ``bad-format``, ``hash-mismatch``, ``missing-file``, ``extra-file``, ``unsafe-path``,
    ``unsafe-member``, ``external-data-outside``, ``expired``, ``downgrade``, ``corrupt``,
    ``too-large``, ``size-mismatch``; the message is for people and names the file, member or
    value at fault."""

    def __init__(self, reason: Reason, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown release refusal reason {reason!r}")  # a bug in the caller
        super().__init__(message)
        self.reason: str = reason


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
) -> Manifest:
    """Sign the export bundle at ``export_dir`` into the release file ``out`` and return its
    manifest.

    ``release``: the release number (>= 0, higher than every earlier release of the model);
    ``targets``: target profile names it may run on (empty: any); ``budget_ms``: the latency
    budget, ms; ``expires_in_days``: days from ``now`` (default: the current time, UTC; a naive
    datetime is taken as UTC) until devices refuse it, None for never.

    ``out`` is written beside itself and renamed into place: it is replaced whole or not at
    all. Refuses a bundle :func:`~deploy_edge.bundle.bundle_files` refuses
    (:class:`~deploy_edge.bundle.IOSpecError`), a bundle file that changes while it is written
    (:class:`ReleaseError` ``corrupt``) and bad arguments (:class:`InputError`).
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
    created = _utc(now)
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
        created_at=_iso(created),
        expires_at=None
        if expires_in_days is None
        else _iso(created + timedelta(days=expires_in_days)),
        key_id=key_id(private_key.public_key()),
    )
    manifest_bytes = _manifest_bytes(manifest)
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


def read_manifest(file: Path) -> Manifest:
    """The manifest of the release ``file``, NOT verified (for display only; install through
    :func:`verify_release`). :class:`ReleaseError` ``corrupt`` / ``bad-format`` when it cannot
    be read."""
    with _open_tar(file) as tar:
        members = _metadata_members(file, tar)
        data = _read_metadata(file, tar, members, MANIFEST_FILE)
    if data is None:
        raise ReleaseError("bad-format", f"{file}: not a robo-pipe release (no {MANIFEST_FILE})")
    return _parse_manifest(file, data)


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

    Does not look at the bundle files (:func:`extract_release` hashes them) nor at expiry and
    release number (:func:`check_policy`).
    """
    if not trusted:
        raise ReleaseError(
            "no-trusted-keys", f"{file}: no trusted public keys configured; refusing to install"
        )
    with _open_tar(file) as tar:
        members = _metadata_members(file, tar)
        manifest_bytes = _read_metadata(file, tar, members, MANIFEST_FILE)
        signature_bytes = _read_metadata(file, tar, members, SIGNATURE_FILE)
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
    manifest = _parse_manifest(file, manifest_bytes)
    if manifest.key_id != signer:
        raise ReleaseError(
            "bad-signature",
            f"{file}: {MANIFEST_FILE} names key {manifest.key_id} but was signed by {signer}",
        )
    return manifest


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
    current = _utc(now)
    if has_expired(manifest.expires_at, current):
        broken.append(
            (
                "expired",
                f"release {manifest.release} of {manifest.model_name} expired at "
                f"{manifest.expires_at} (now {_iso(current)})",
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
    return expires_at is not None and _utc(now) >= _parse_time(expires_at, "expires_at")


def extract_release(
    file: Path, manifest: Manifest, dest: Path, *, max_bytes: int | None = None
) -> Path:
    """Unpack the release ``file``, whose verified manifest is ``manifest``, into the new
    directory ``dest`` and return the bundle directory in it (``dest/bundle``, which
    :func:`deploy_edge.bundle.read_io_spec` reads); ``dest`` also receives ``manifest.json``
    and ``manifest.sig``, so that the installed release can be verified again.

    ``max_bytes``: the most this release may take, bytes (a device's ``max_release_mb``); both
    the release file and the sum of the manifest's ``sizes`` must be within it. None: no cap
    (a workstation checking its own release).

    Unpacks into a staging directory beside ``dest`` and renames it into place once every check
    passed; on a refusal neither is left. At most the manifest's ``sizes`` are ever written (plus
    the two manifest members, each at most 16 MiB). Refuses with :class:`ReleaseError`:

    - ``too-large``: the release file or its declared sizes exceed ``max_bytes`` (before
      anything is written);
    - ``size-mismatch``: a bundle member whose tar header size is not the manifest's (before a
      byte of it is written), or whose data runs past that size (the copy stops there);

    - ``unsafe-path``: a member with an absolute path, a ``..`` or ``.`` component, an empty
      component or a backslash, or outside ``bundle/`` (other than the two manifest members);
    - ``unsafe-member``: a member that is not a regular file or directory (symlinks, hard links,
      devices, fifos, sparse files) or appears twice;
    - ``extra-file`` / ``missing-file``: a bundle file the manifest does not list / a listed one
      the file lacks; ``hash-mismatch``: a bundle file whose sha256 is not the listed one;
    - ``external-data-outside``: the model (the spec's ``onnx_file``) or a precision variant
      (its ``variants``' files) reads external data from a location that is not a file of the
      bundle the manifest lists;
    - ``corrupt``: an unreadable archive, a ``manifest.json`` other than ``manifest``, a bundle
      whose ``io_spec.json`` differs from the manifest's; ``bad-format`` / ``unsigned``: no
      manifest / signature member, or a compressed file (before anything is written).

    ``dest`` must not exist (:class:`InputError`); its parent is created if missing.
    """
    target = Path(dest)
    if target.exists() or target.is_symlink():
        raise InputError(f"{target}: already exists (extract a release into a new directory)")
    _check_listed_paths(file, manifest)
    _check_size(file, manifest, max_bytes)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    try:
        _extract_into(file, manifest, staging)
        bundle = staging / BUNDLE_DIR
        _check_external_data(file, manifest, bundle)
        try:
            spec = read_io_spec(bundle)
        except IOSpecError as err:
            raise ReleaseError("corrupt", f"{file}: the bundle's I/O spec: {err}") from err
        if spec != manifest.io_spec:
            raise ReleaseError(
                "corrupt", f"{file}: the bundle's io_spec.json differs from the manifest's io_spec"
            )
        staging.chmod(0o755)
        if target.exists() or target.is_symlink():
            raise InputError(f"{target}: appeared while the release was extracted")
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target / BUNDLE_DIR


# --- writing ---


def _manifest_bytes(manifest: Manifest) -> bytes:
    """The exact bytes of ``manifest.json`` (what the signature covers)."""
    return (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode()


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


def _utc(moment: datetime | None) -> datetime:
    if moment is None:
        return datetime.now(UTC)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _parse_time(value: str, field: str) -> datetime:
    try:
        return _utc(datetime.fromisoformat(value))
    except (TypeError, ValueError) as err:
        raise ReleaseError(
            "bad-format", f"{MANIFEST_FILE}: field {field!r} = {value!r}: not an ISO 8601 time"
        ) from err


# --- reading ---


@contextlib.contextmanager
def _open_tar(file: Path) -> Iterator[tarfile.TarFile]:
    _refuse_compressed(file)
    try:
        tar = tarfile.open(file, "r:")  # noqa: SIM115  # closed by the `with tar` below
    except FileNotFoundError as err:
        raise ReleaseError("corrupt", f"{file}: no such release file") from err
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ReleaseError("corrupt", f"{file}: not a readable release file ({err})") from err
    try:
        with tar:
            yield tar
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise ReleaseError("corrupt", f"{file}: unreadable archive ({err})") from err


def _refuse_compressed(file: Path) -> None:
    """``bad-format`` for a gzip, bzip2 or xz file: only an uncompressed release's own size
    bounds what it unpacks to (a 373 KiB gzip release unpacked to 256 MiB)."""
    try:
        with Path(file).open("rb") as raw:
            head = raw.read(8)
    except FileNotFoundError as err:
        raise ReleaseError("corrupt", f"{file}: no such release file") from err
    except OSError as err:
        raise ReleaseError("corrupt", f"{file}: not a readable release file ({err})") from err
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise ReleaseError(
                "bad-format",
                f"{file}: a {kind}-compressed file; a release is an uncompressed tar file (as "
                "robo-pipe bundle writes it), whose size bounds what it unpacks to",
            )


def _metadata_members(file: Path, tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """The manifest and signature members of ``tar`` by name (each must be unique)."""
    found: dict[str, tarfile.TarInfo] = {}
    for member in tar:
        if member.name in (MANIFEST_FILE, SIGNATURE_FILE):
            if member.name in found:
                raise ReleaseError("corrupt", f"{file}: member {member.name!r} appears twice")
            found[member.name] = member
    return found


def _read_metadata(
    file: Path, tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str
) -> bytes | None:
    member = members.get(name)
    if member is None:
        return None
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise ReleaseError("unsafe-member", f"{file}: member {name!r} is not a regular file")
    if member.size > _MAX_METADATA_BYTES:
        raise ReleaseError("corrupt", f"{file}: member {name!r} is {member.size} bytes (too large)")
    data = tar.extractfile(member)
    assert data is not None  # a regular file
    return data.read()


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


def _parse_manifest(file: Path, data: bytes) -> Manifest:
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
            _parse_time(value, field)
    _check_listed_paths(file, manifest)
    return manifest


def _check_listed_paths(file: Path, manifest: Manifest) -> None:
    """Every path the manifest lists is a plain relative path, and it lists the model."""
    for rel in manifest.files:
        _safe_parts(file, rel, f"{MANIFEST_FILE} lists file")
    model = manifest.io_spec.onnx_file
    if model not in manifest.files:
        raise ReleaseError(
            "bad-format",
            f"{file}: {MANIFEST_FILE}: io_spec.onnx_file = {model!r} is not among its files",
        )


def _safe_parts(file: Path, name: str, what: str) -> tuple[str, ...]:
    """The components of the relative POSIX path ``name``; ``unsafe-path`` unless it is plain:
    not absolute, no empty, ``.`` or ``..`` component, no backslash or NUL."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise ReleaseError("unsafe-path", f"{file}: {what} {name!r}: not a plain relative path")
    parts = tuple(name.split("/"))
    if any(part in ("", ".", "..") for part in parts):
        raise ReleaseError(
            "unsafe-path", f"{file}: {what} {name!r}: has an empty, '.' or '..' component"
        )
    return parts


# --- extracting ---


def _check_size(file: Path, manifest: Manifest, max_bytes: int | None) -> None:
    """``too-large`` when the release file or the sum of its declared sizes is over
    ``max_bytes`` (None: no cap); checked before anything is written."""
    _refuse_compressed(file)
    if max_bytes is None:
        return
    cap = f"this device's cap of {max_bytes} bytes ({max_bytes / (1 << 20):.1f} MiB)"
    declared = sum(manifest.sizes.values())
    if declared > max_bytes:
        raise ReleaseError(
            "too-large",
            f"{file}: its manifest declares {declared} bytes of bundle files, over {cap}",
        )
    size = Path(file).stat().st_size
    if size > max_bytes:
        raise ReleaseError("too-large", f"{file}: the release file is {size} bytes, over {cap}")


def _extract_into(file: Path, manifest: Manifest, staging: Path) -> None:
    """Unpack ``file`` into the empty directory ``staging``, checking every member."""
    seen: set[str] = set()
    found: set[str] = set()
    with _open_tar(file) as tar:
        for member in tar:
            name = member.name
            parts = _safe_parts(file, name, "member")
            if name in seen:
                raise ReleaseError("unsafe-member", f"{file}: member {name!r} appears twice")
            seen.add(name)
            kind = "directory" if member.isdir() else "file"
            if member.isdir():
                if parts[0] != BUNDLE_DIR:
                    raise ReleaseError(
                        "unsafe-path", f"{file}: member {name!r}: a directory outside {BUNDLE_DIR}/"
                    )
            elif member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                raise ReleaseError(
                    "unsafe-member",
                    f"{file}: member {name!r}: a {_kind(member)}, only regular files are allowed",
                )
            elif name in (MANIFEST_FILE, SIGNATURE_FILE):
                pass
            elif parts[0] != BUNDLE_DIR or len(parts) < 2:
                raise ReleaseError("unsafe-path", f"{file}: member {name!r}: outside {BUNDLE_DIR}/")
            elif "/".join(parts[1:]) not in manifest.files:
                raise ReleaseError(
                    "extra-file",
                    f"{file}: member {name!r}: a bundle file the manifest does not list",
                )
            try:  # PEP 706: the standard library's own judgement, as a second line
                tarfile.data_filter(member, str(staging))
            except tarfile.FilterError as err:
                reason: Reason = (
                    "unsafe-path"
                    if isinstance(err, tarfile.AbsolutePathError | tarfile.OutsideDestinationError)
                    else "unsafe-member"
                )
                raise ReleaseError(reason, f"{file}: member {name!r}: {err}") from err
            limit = _member_limit(file, manifest, member, parts)
            path = staging.joinpath(*parts)
            try:
                if member.isdir():
                    path.mkdir(mode=0o755, parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                digest = _write_member(tar, member, path, limit, f"{file}: member {name!r}")
            except OSError as err:
                raise ReleaseError(
                    "unsafe-member", f"{file}: member {name!r}: cannot write this {kind} ({err})"
                ) from err
            if name == MANIFEST_FILE:
                if path.read_bytes() != _manifest_bytes(manifest) and _reparsed(path) != manifest:
                    raise ReleaseError(
                        "corrupt",
                        f"{file}: its {MANIFEST_FILE} is not the manifest given "
                        "(was the file replaced after it was verified?)",
                    )
            elif name != SIGNATURE_FILE:
                rel = "/".join(parts[1:])
                if digest != manifest.files[rel]:
                    raise ReleaseError(
                        "hash-mismatch",
                        f"{file}: bundle file {rel!r} has sha256 {digest}, "
                        f"the manifest lists {manifest.files[rel]}",
                    )
                found.add(rel)
    if MANIFEST_FILE not in seen:
        raise ReleaseError("bad-format", f"{file}: not a robo-pipe release (no {MANIFEST_FILE})")
    if SIGNATURE_FILE not in seen:
        raise ReleaseError("unsigned", f"{file}: unsigned release (no {SIGNATURE_FILE})")
    missing = sorted(set(manifest.files) - found)
    if missing:
        raise ReleaseError(
            "missing-file",
            f"{file}: bundle file{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} "
            "listed in the manifest but not in the release",
        )


def _member_limit(
    file: Path, manifest: Manifest, member: tarfile.TarInfo, parts: tuple[str, ...]
) -> int:
    """The most bytes the regular file ``member`` may write, bytes: a bundle file's signed size
    (``size-mismatch`` when its tar header says otherwise, before a byte is written), at most
    16 MiB for the manifest and its signature. 0 for a directory."""
    if member.isdir():
        return 0
    name = member.name
    if name in (MANIFEST_FILE, SIGNATURE_FILE):
        if member.size > _MAX_METADATA_BYTES:
            raise ReleaseError(
                "corrupt", f"{file}: member {name!r} is {member.size} bytes (too large)"
            )
        return member.size
    rel = "/".join(parts[1:])
    if member.size != manifest.sizes[rel]:
        raise ReleaseError(
            "size-mismatch",
            f"{file}: member {name!r} is {member.size} bytes in the archive, the manifest lists "
            f"{manifest.sizes[rel]}",
        )
    return manifest.sizes[rel]


def _write_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path, limit: int, where: str
) -> str:
    """Copy a regular file member to the new file ``path``, writing at most ``limit`` bytes
    (``size-mismatch`` at the first byte past it, which is not written); returns the sha256 of
    the bytes written. The header was checked against ``limit`` already: this is the second
    line, should a reader ever yield more than its header says."""
    source = tar.extractfile(member)
    assert source is not None  # a regular file
    digest = hashlib.sha256()
    written = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with source, os.fdopen(os.open(path, flags, 0o644), "wb") as out:
        # one byte more than is left, so that an excess is seen without being written
        while chunk := source.read(min(_CHUNK, limit - written + 1)):
            if written + len(chunk) > limit:
                raise ReleaseError(
                    "size-mismatch", f"{where}: runs past its declared {limit} bytes"
                )
            digest.update(chunk)
            out.write(chunk)
            written += len(chunk)
    return digest.hexdigest()


def _reparsed(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(json.loads(path.read_bytes()))
    except (ValueError, RecordError):
        return None


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"hard link to {member.linkname!r}"
    if member.ischr() or member.isblk():
        return "device"
    if member.isfifo():
        return "fifo"
    if member.issparse():
        return "sparse file"
    return f"member of tar type {member.type!r}"


def _check_external_data(file: Path, manifest: Manifest, bundle: Path) -> None:
    """Every external data location of the model, of each precision variant and of the
    instruction graph is a file of the bundle the manifest lists (relative to the model's
    directory, as ONNX resolves it)."""
    for model in manifest.io_spec.graph_files:
        _check_model_data(file, manifest, bundle, model)


def _check_model_data(file: Path, manifest: Manifest, bundle: Path, model: str) -> None:
    model_dir = PurePosixPath(model).parent
    root = bundle.resolve()
    for tensor, location in _external_locations(file, bundle / model):
        where = f"{file}: {model}: tensor {tensor!r} reads external data from {location!r}"
        try:
            parts = _safe_parts(file, location, "external data location")
        except ReleaseError as err:
            raise ReleaseError("external-data-outside", f"{where}: outside the bundle") from err
        rel = (model_dir / PurePosixPath(*parts)).as_posix()
        resolved = (bundle / rel).resolve()
        if rel not in manifest.files or not resolved.is_relative_to(root) or not resolved.is_file():
            raise ReleaseError(
                "external-data-outside", f"{where}: not a file of the bundle the manifest lists"
            )


def _external_locations(file: Path, model: Path) -> list[tuple[str, str]]:
    """``(tensor name, location)`` of every tensor of the ONNX file ``model`` whose data is
    external: initializers, node attributes, sparse tensors, subgraphs, functions, training
    info; the whole message tree is walked so no place a tensor can hide is missed."""
    import onnx

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends
        raise ReleaseError(
            "corrupt", f"{file}: {model.name}: not a readable ONNX model ({err})"
        ) from err
    found: list[tuple[str, str]] = []
    stack: list[Any] = [proto]
    while stack:
        message = stack.pop()
        if isinstance(message, onnx.TensorProto):
            entries = {entry.key: entry.value for entry in message.external_data}
            if message.data_location == onnx.TensorProto.EXTERNAL or entries:
                found.append((message.name, entries.get("location", "")))
        for descriptor, value in message.ListFields():
            if descriptor.message_type is None:
                continue
            if hasattr(value, "ListFields"):
                stack.append(value)
            else:
                stack.extend(value)
    return found
