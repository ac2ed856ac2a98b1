"""Typed records with a JSON round trip.

Every stage hands the next one a small dataclass (paths, hashes, figures; never tensors).
:class:`Record` gives such a dataclass ``to_json()`` (plain dicts and lists) and
``from_json()`` (the same types back, nested records included), so that resume files, CLI
``--json`` output and Prefect results all carry one typed shape.

Supported field types: ``str``, ``int``, ``float``, ``bool``, ``None``, nested records (any
dataclass), ``list[T]``, ``tuple[T, ...]``, ``tuple[T, U]``, ``dict[str, T]``, ``T | None``
and ``Any`` (kept as is). Annotations are resolved with :func:`typing.get_type_hints`, so a
record's field types must be importable at run time (not only under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Self, TypeVar, Union

T = TypeVar("T")


class RecordError(ValueError):
    """JSON that does not fit a record type (a stale or hand-edited record file)."""


class Record:
    """Mixin for dataclasses: ``to_json`` / ``from_json`` (see the module docstring)."""

    def to_json(self) -> dict[str, Any]:
        """Plain-dict form (JSON-serialisable; tuples become lists)."""
        assert dataclasses.is_dataclass(self)
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """The record ``data`` describes; :class:`RecordError` if it does not fit."""
        return decode(cls, data)


def decode(kind: type[T], data: Any) -> T:
    """``data`` (parsed JSON) as an instance of the dataclass ``kind``."""
    return typing.cast(T, _decode(kind, data, kind.__name__))


def _decode(kind: Any, value: Any, where: str) -> Any:
    if kind is Any or kind is object:
        return value
    origin = typing.get_origin(kind)
    if origin in (Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode(option, value, where)
            except RecordError as err:
                errors.append(str(err))
        raise RecordError("; ".join(errors))
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, Mapping):
            raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(kind)
        known = {f.name: f for f in dataclasses.fields(kind) if f.init}
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise RecordError(f"{where}: unknown fields {', '.join(unknown)}")
        given = {}
        for name, f in known.items():
            if name in value:
                given[name] = _decode(hints[name], value[name], f"{where}.{name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where}: missing field {name}")
        return kind(**given)  # type: ignore[operator]  # a dataclass type, narrowed as an instance
    if origin in (list, tuple, dict):
        args = typing.get_args(kind)
        if origin is dict:
            if not isinstance(value, Mapping):
                raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
            item = args[1] if args else Any
            return {str(k): _decode(item, v, f"{where}.{k}") for k, v in value.items()}
        if not isinstance(value, list | tuple):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        if origin is list:
            item = args[0] if args else Any
            return [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise RecordError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(
            _decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecordError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if kind in (int, str, bool, type(None)):
        if type(value) is not kind:  # exact: a bool is not accepted as an int
            raise RecordError(f"{where}: expected {kind.__name__}, got {value!r}")
        return value
    raise TypeError(f"{where}: records cannot hold {kind!r}")  # a bug in the record type
