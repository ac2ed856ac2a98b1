"""The ONNX external data of a bundle's graphs: every location stays a file of the bundle.

An ONNX tensor may keep its bytes in another file, named by a ``location`` relative to the
graph's directory; a graph that names ``../../etc/passwd`` or an absolute path there makes
whoever loads it read outside the bundle (the ONNX external-data path traversal CVEs).
:func:`check_external_data` holds every graph of a bundle (the model, each precision variant,
the instruction graph) to the files the bundle is signed for; a release extraction
(:mod:`deploy_edge.release.payload`) runs it before a device loads a byte. Reads the graphs
with ``onnx`` (without their external data).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from deploy_edge.bundle.io_spec import IOSpec, IOSpecError
from deploy_edge.bundle.layout import relative_parts


class ExternalDataError(IOSpecError):
    """A graph of the bundle reads external data from a location that is not one of the
    bundle's listed files. The message names the graph, the tensor and the location."""


def check_external_data(bundle: Path, spec: IOSpec, listed: Collection[str]) -> None:
    """Every external data location of the model, of each precision variant and of the
    instruction graph (``spec.graph_files``) is a file of the bundle at ``bundle`` that
    ``listed`` (bundle-relative POSIX paths: a release manifest's ``files``) holds, relative to
    the graph's directory as ONNX resolves it, and resolves to a file inside ``bundle``.

    Raises :class:`ExternalDataError` for the first location that is not;
    :class:`IOSpecError` for a graph that is not a readable ONNX model."""
    for graph in spec.graph_files:
        _check_graph_data(bundle, graph, listed)


def _check_graph_data(bundle: Path, graph: str, listed: Collection[str]) -> None:
    graph_dir = PurePosixPath(graph).parent
    root = bundle.resolve()
    for tensor, location in external_locations(bundle / graph):
        where = f"{graph}: tensor {tensor!r} reads external data from {location!r}"
        try:
            parts = relative_parts(location)
        except ValueError as err:
            raise ExternalDataError(f"{where}: outside the bundle") from err
        rel = (graph_dir / PurePosixPath(*parts)).as_posix()
        resolved = (bundle / rel).resolve()
        if rel not in listed or not resolved.is_relative_to(root) or not resolved.is_file():
            raise ExternalDataError(f"{where}: not a file of the bundle the manifest lists")


def external_locations(model: Path) -> list[tuple[str, str]]:
    """``(tensor name, location)`` of every tensor of the ONNX file ``model`` whose data is
    external: initializers, node attributes, sparse tensors, subgraphs, functions, training
    info; the whole message tree is walked so no place a tensor can hide is missed.
    :class:`IOSpecError` when ``model`` is not a readable ONNX model."""
    import onnx

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends
        raise IOSpecError(f"{model.name}: not a readable ONNX model ({err})") from err
    return [(tensor.name, entries.get("location", "")) for tensor, entries in _external(proto)]


def tensor_starts(graphs: Mapping[str, bytes]) -> dict[str, set[int]]:
    """Where each external tensor's bytes begin in its data file, for a bundle's graphs
    (bundle-relative path of each ``.onnx`` file -> its bytes): bundle-relative data file ->
    byte offsets. A graph that does not parse gives none (what uses these only cuts files at
    them; :func:`check_external_data` is what refuses)."""
    import onnx

    starts: dict[str, set[int]] = {}
    for graph, data in graphs.items():
        try:
            proto = onnx.load_model_from_string(data)
        except Exception:  # protobuf's DecodeError and friends
            continue
        for _, entries in _external(proto):
            try:
                parts = relative_parts(entries.get("location", ""))
                offset = int(entries.get("offset", "0"))
            except ValueError:
                continue
            rel = (PurePosixPath(graph).parent / PurePosixPath(*parts)).as_posix()
            starts.setdefault(rel, set()).add(offset)
    return starts


def _external(proto: Any) -> Iterator[tuple[Any, dict[str, str]]]:
    """Every tensor of the model ``proto`` whose data is external, with its ``external_data``
    entries (location, offset, length), found by walking the whole message tree."""
    import onnx

    stack: list[Any] = [proto]
    while stack:
        message = stack.pop()
        if isinstance(message, onnx.TensorProto):
            entries = {entry.key: entry.value for entry in message.external_data}
            if message.data_location == onnx.TensorProto.EXTERNAL or entries:
                yield message, entries
        for descriptor, value in message.ListFields():
            if descriptor.message_type is None:
                continue
            if hasattr(value, "ListFields"):
                stack.append(value)
            else:
                stack.extend(value)
