"""Typed-config validation shared by every file robo-pipe reads (devices and fleet files, device
configs, target profiles, the ``sim:`` section): one message for a field that does not
validate, and one rule for a name that must be one of a registry's."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


def one_of(choices: Collection[str], what: str) -> Callable[[str], str]:
    """A pydantic ``AfterValidator`` for a field naming one of ``choices`` (a registry's
    keys, read when a value is checked, so entries added later count): an unknown name is a
    ``ValueError`` listing the valid ones, e.g. ``unknown simulator backend; valid choices:
    mujoco, isaaclab``."""

    def check(name: str) -> str:
        if name not in choices:
            raise ValueError(f"unknown {what}; valid choices: {', '.join(choices)}")
        return name

    return check


def read_mapping(file: Path, what: str, error: type[Exception]) -> dict[str, Any]:
    """The YAML mapping in ``file`` (a ``what``, e.g. ``fleet file``); ``error`` with a message
    naming the file when it is missing, is not YAML or holds something else than a mapping."""
    if not file.is_file():
        raise error(f"{file}: no such {what}")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise error(f"{file}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise error(f"{file}: expected a mapping of fields, got {type(data).__name__}")
    return data


def first_error(file: str | Path, err: ValidationError) -> str:
    """The first problem of ``err`` (raised validating the contents of ``file``) as one line
    naming the file, the field and its value: ``<file>: missing field 'a.b'`` or ``<file>:
    field 'a.b' = <value>: <why>`` (``<file>: <why>`` for a rule over the whole file)."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        return f"{file}: missing field '{loc}'"
    if not loc:
        return f"{file}: {msg}"
    return f"{file}: field '{loc}' = {_shown(first.get('input'))!r}: {msg}"


def _shown(value: Any) -> Any:
    """A value short enough for one line: a mapping shows its first four entries."""
    return value if not isinstance(value, dict) else {k: value[k] for k in list(value)[:4]}
