"""The export bundle's files: which files a bundle is, their checksums, and copying one.

:func:`bundle_files` lists a bundle's files (:mod:`deploy_edge.bundle.layout`);
:func:`verify_bundle` checks a bundle against its ``checksums.json``, which
:func:`write_bundle_checksums` writes; :func:`copy_bundle` copies a verified bundle with its
own checksums; :func:`model_hash` is the model's content hash. Imports nothing beyond the
standard library and the kernel.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from deploy_edge.bundle.io_spec import IOSpec, IOSpecError, read_io_spec, write_io_spec
from deploy_edge.bundle.layout import (
    IO_SPEC_FILE,
    NORMALIZATION_FILE,
    ONNX_FILE,
    REFERENCE_FILE,
    TOKENIZER_FILE,
    bundle_root,
)
from robo_pipe.integrity import (
    CHECKSUMS_FILE,
    FileSum,
    file_sums,
    tree_sha256,
    verify_checksums,
    write_checksums,
)

VERIFY_FIX = "re-export it (robo-pipe export), or fetch the registry version again"
"""What to do about a bundle that fails verification (or predates checksums)."""


def model_files(directory: str | Path, onnx_file: str = ONNX_FILE) -> list[Path]:
    """The model ``onnx_file`` in ``directory`` and its external data files, sorted by name
    (the ONNX file first); those present."""
    root = Path(directory)
    return sorted(root.glob(f"{onnx_file}*"), key=lambda p: (p.name != onnx_file, p.name))


def bundle_files(directory: str | Path) -> list[Path]:
    """Every file of the bundle at ``directory``, sorted, relative to it: the model (the spec's
    ``onnx_file``) and its external data, ``io_spec.json``, the tokenizer files, and
    ``reference.npz``, ``normalization.json`` and ``checksums.json`` when present. Other files
    beside them (an MLflow ``MLmodel``, a built TensorRT plan) are not part of the bundle.

    Refuses (:class:`IOSpecError`) a bundle whose spec is unreadable or that lacks its model or
    its tokenizer."""
    root = bundle_root(directory)
    spec = read_io_spec(root)
    model = model_files(root, spec.onnx_file)
    if not model or model[0].name != spec.onnx_file:
        raise IOSpecError(
            f"{root / IO_SPEC_FILE}: field 'onnx_file' = {spec.onnx_file!r}: no such file"
        )
    tokenizer = root / spec.tokenizer / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise IOSpecError(
            f"{root / IO_SPEC_FILE}: field 'tokenizer' = {spec.tokenizer!r}: "
            f"no {TOKENIZER_FILE} in it"
        )
    files = [*model, root / IO_SPEC_FILE]
    for variant in spec.variants:
        extra = model_files(root, variant.onnx_file)
        if not extra or extra[0].name != variant.onnx_file:
            raise IOSpecError(
                f"{root / IO_SPEC_FILE}: variant {variant.name!r}: field 'onnx_file' = "
                f"{variant.onnx_file!r}: no such file"
            )
        files += extra
    if spec.instruction_graph is not None:
        graph = model_files(root, spec.instruction_graph.onnx_file)
        if not graph or graph[0].name != spec.instruction_graph.onnx_file:
            raise IOSpecError(
                f"{root / IO_SPEC_FILE}: instruction_graph: field 'onnx_file' = "
                f"{spec.instruction_graph.onnx_file!r}: no such file"
            )
        files += graph
    files += [p for p in (root / spec.tokenizer).rglob("*") if p.is_file()]
    files += [
        root / f
        for f in (REFERENCE_FILE, NORMALIZATION_FILE, CHECKSUMS_FILE)
        if (root / f).is_file()
    ]
    return sorted(p.relative_to(root) for p in files)


def verify_bundle(directory: str | Path, only: Iterable[str] | None = None) -> dict[str, FileSum]:
    """Check the bundle at ``directory`` against its ``checksums.json``: every bundle file
    listed and no other, each of the listed size and sha256 (``only``: hash just these; the
    others' sizes are still checked). Returns the verified entries (bundle-relative POSIX
    path -> size and sha256).

    Raises :class:`~robo_pipe.integrity.IntegrityError` naming the file and the check, and
    :class:`IOSpecError` for a bundle :func:`bundle_files` refuses."""
    root = bundle_root(directory)
    return verify_checksums(root, bundle_files(root), CHECKSUMS_FILE, VERIFY_FIX, only)


def write_bundle_checksums(
    directory: str | Path, known: Mapping[str, FileSum] | None = None
) -> dict[str, FileSum]:
    """Write the ``checksums.json`` of the bundle at ``directory``, listing every other bundle
    file; the entries in ``known`` (verified ones of the files it was copied from) are taken as
    they are, the others hashed. Returns what it wrote."""
    root = bundle_root(directory)
    known = known or {}
    files = [p.as_posix() for p in bundle_files(root) if p.as_posix() != CHECKSUMS_FILE]
    sums = {rel: known[rel] for rel in files if rel in known}
    sums |= file_sums(root, [rel for rel in files if rel not in known])
    write_checksums(root, sums)
    return sums


def model_hash(sums: Mapping[str, FileSum], onnx_file: str = ONNX_FILE) -> str:
    """sha256 over the model ``onnx_file`` and its external data (names and sha256s, the ONNX
    file first), from a bundle's verified entries (:func:`verify_bundle`)."""
    names = sorted(
        (rel for rel in sums if "/" not in rel and rel.startswith(onnx_file)),
        key=lambda name: (name != onnx_file, name),
    )
    return tree_sha256((name, sums[name].sha256) for name in names)


def copy_bundle(
    src: str | Path,
    dst: str | Path,
    *,
    model_file: str | None = None,
    verified: Mapping[str, FileSum] | None = None,
) -> IOSpec:
    """Copy the bundle at ``src`` into the directory ``dst`` (created if missing; files of the
    same names replaced), with its own ``checksums.json``, and return the spec written there.

    The source is verified first (:func:`verify_bundle`) unless ``verified`` holds what that
    returned for it; the copy's checksums take the copied files' verified entries, so a copy
    that came out different is refused when opened. ``model_file``: the model is already in
    ``dst`` under this name (the registry's MLflow ``onnx`` flavor writes ``model.onnx``
    itself): the model is then not copied, the copy's spec names ``model_file`` as its
    ``onnx_file`` and the checksums hash that file as it is.
    """
    source, target = bundle_root(src), Path(dst)
    files = bundle_files(source)
    spec = read_io_spec(source)
    sums = dict(verified) if verified is not None else verify_bundle(source)
    target.mkdir(parents=True, exist_ok=True)
    model = {p.name for p in model_files(source, spec.onnx_file)}
    if model_file is not None:
        if not (target / model_file).is_file():
            raise IOSpecError(f"{target}: model file {model_file!r} missing (write it first)")
        spec = dataclasses.replace(spec, onnx_file=model_file)
    copied: dict[str, FileSum] = {}
    for rel in files:
        if rel.parent == Path(".") and rel.name in (IO_SPEC_FILE, CHECKSUMS_FILE):
            continue  # written for the copy below
        if model_file is not None and rel.parent == Path(".") and rel.name in model:
            continue
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, target / rel)
        copied[rel.as_posix()] = sums[rel.as_posix()]
    write_io_spec(target, spec)
    write_bundle_checksums(target, copied)
    return spec
