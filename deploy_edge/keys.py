"""Release signing keys: Ed25519 key pairs as PEM files.

The build side signs a release with a private key (``<name>.key``: PKCS8 PEM, unencrypted, file
mode 0600); an edge device trusts the public keys it is configured with (``<name>.pub``:
SubjectPublicKeyInfo PEM) and refuses a release signed by any other (see
:mod:`deploy_edge.release`). A key is named by :func:`key_id`, which the release's signature
carries so that a device holding several trusted keys (key rotation) knows which one to check.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from robo_pipe.errors import RoboPipeError

PRIVATE_SUFFIX = ".key"
"""File name suffix of a private key."""
PUBLIC_SUFFIX = ".pub"
"""File name suffix of a public key."""


class SigningKeyError(RoboPipeError, ValueError):
    """A key file is missing, unreadable, not PEM, encrypted, or not an Ed25519 key of the
    expected kind; or :func:`generate_keypair` would overwrite one. The message names the file."""


def generate_keypair(out_dir: Path, name: str = "robo-pipe") -> tuple[Path, Path]:
    """Write a new Ed25519 key pair as ``<out_dir>/<name>.key`` (private, PKCS8 PEM,
    unencrypted, mode 0600) and ``<out_dir>/<name>.pub`` (public, SubjectPublicKeyInfo PEM);
    returns ``(private file, public file)``. ``out_dir`` is created if missing.

    Refuses (:class:`SigningKeyError`) a ``name`` that is not a plain file name and an existing
    key file of either name: a key is never overwritten."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise SigningKeyError(f"key name {name!r}: expected a plain file name")
    directory = Path(out_dir)
    private_path = directory / f"{name}{PRIVATE_SUFFIX}"
    public_path = directory / f"{name}{PUBLIC_SUFFIX}"
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise SigningKeyError(f"{path}: already exists (refusing to overwrite a key)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SigningKeyError(f"{directory}: cannot create the key directory ({err})") from err
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write_new(private_path, private_pem, 0o600)
    try:
        _write_new(public_path, public_pem, 0o644)
    except SigningKeyError:
        private_path.unlink(missing_ok=True)
        raise
    return private_path, public_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file ``path`` (unencrypted PKCS8, as
    :func:`generate_keypair` writes it); :class:`SigningKeyError` otherwise."""
    key = _load(path, "private", lambda data: serialization.load_pem_private_key(data, None))
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path}: a {type(key).__name__} key, expected an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in the PEM file ``path`` (SubjectPublicKeyInfo, as
    :func:`generate_keypair` writes it); :class:`SigningKeyError` otherwise."""
    key = _load(path, "public", serialization.load_pem_public_key)
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path}: a {type(key).__name__} key, expected an Ed25519 key")
    return key


def _load(path: Path, kind: str, parse: Callable[[bytes], object]) -> object:
    """Parse the PEM key file ``path`` with ``parse``; every failure named by the file."""
    data = _read(path)
    other = "public" if kind == "private" else "private"
    try:
        return parse(data)
    except TypeError as err:  # an encrypted private key (a password is needed)
        raise SigningKeyError(
            f"{path}: encrypted {kind} key ({err}); expected unencrypted"
        ) from err
    except ValueError as err:
        wrong = f"{other.upper()} KEY".encode() in data
        hint = f" (this is a {other} key; pass the .{'key' if kind == 'private' else 'pub'} file)"
        raise SigningKeyError(f"{path}: not a PEM {kind} key{hint if wrong else ''}") from err
    except Exception as err:  # cryptography raises UnsupportedAlgorithm for exotic keys
        raise SigningKeyError(f"{path}: unsupported {kind} key ({err})") from err


def key_id(public_key: Ed25519PublicKey) -> str:
    """The key's name: the first 16 hex digits of the sha256 of its 32 raw public bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError as err:
        raise SigningKeyError(f"{path}: no such key file") from err
    except OSError as err:
        raise SigningKeyError(f"{path}: cannot read the key file ({err.strerror or err})") from err


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` (never replacing a file, never following a link) with ``mode``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError as err:
        raise SigningKeyError(f"{path}: already exists (refusing to overwrite a key)") from err
    except OSError as err:
        raise SigningKeyError(f"{path}: cannot create the key file ({err.strerror})") from err
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; never added any
        with os.fdopen(fd, "wb") as out:
            fd = -1
            out.write(data)
    except OSError as err:
        if fd >= 0:
            os.close(fd)
        path.unlink(missing_ok=True)
        raise SigningKeyError(f"{path}: cannot write the key file ({err.strerror})") from err
