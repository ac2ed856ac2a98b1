"""``verify``: check datasets, checkpoints, exports or releases against the checksums they were
written with, on demand (every stage does the same when it opens one)."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.common import emit_json, report_user_error, result_console
from pipelines.cli.options import JsonOpt, add_verb
from robo_pipe.errors import InputError, RoboPipeError
from robo_pipe.integrity import FileSum


@dataclass
class Verified:
    """What ``robo-pipe verify`` checked (its ``--json`` record)."""

    kind: str
    """``dataset``, ``checkpoint``, ``export`` or ``release``."""
    path: str
    files: int
    bytes: int
    seconds: float
    checked: list[str] = field(default_factory=list)
    """What was checked besides the files' sizes and sha256."""

    def to_json(self) -> dict[str, object]:
        """Plain-dict form for JSON output."""
        return dict(self.__dict__)


def verify(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Datasets, checkpoints or exports (directories, or an export's .onnx file), "
            "or release files.",
            show_default=False,
        ),
    ],
    json_out: JsonOpt = False,
) -> None:
    """Verify datasets, checkpoints, exports or releases: every file's size and sha256 against
    the checksums written with it (a release: against its manifest), none missing or added.

    A dataset is also checked as a stage opens it (schema, counts, video frames); a checkpoint's
    base checkpoint is verified too and its hash compared with the one recorded. Each PATH is
    checked, and each failure named with its file and check: exit 1 if one failed a check, 2
    if one is missing or not a thing it verifies. A release's signature is not checked here
    (the device checks it against its trusted keys).
    """
    records, codes, out = [], {0}, result_console(json_out)
    for path in paths:
        start = time.perf_counter()
        try:
            kind, sums, checked = _verify(path)
        except RoboPipeError as err:  # the next path is still checked
            report_user_error(err)
            codes.add(2 if isinstance(err, InputError) else 1)  # bad input, or a failed check
            continue
        record = Verified(
            kind=kind,
            path=str(path),
            files=len(sums),
            bytes=sum(s.size for s in sums.values()),
            seconds=time.perf_counter() - start,
            checked=checked,
        )
        out.print(
            f"[green]verified[/green] {kind} {path}: {record.files} files, "
            f"{record.bytes / 1e6:.1f} MB in {record.seconds:.2f} s (size and sha256 of each)",
            highlight=False,
        )
        for line in checked:
            out.print(f"  {line}", highlight=False)
        records.append(record.to_json())
    emit_json(records, json_out)
    if max(codes):
        raise typer.Exit(code=max(codes))


def _verify(path: Path) -> tuple[str, dict[str, FileSum], list[str]]:
    """Detect what ``path`` is and verify it: (kind, verified entries, other checks made)."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    root = path.parent if path.suffix == ".onnx" else path
    if (root / "meta" / "info.json").is_file() or (root / "meta" / "checksums.json").is_file():
        from stages.dataset.reader import open_dataset

        dataset = open_dataset(root)
        return "dataset", dataset.checksums, [f"{dataset.num_episodes} episodes, schema and counts"]
    if (root / "policy.json").is_file():
        from stages.policy.checkpoint import check_base, read_policy_meta, verify_checkpoint
        from stages.policy.types import BaseRef

        sums = verify_checkpoint(root)
        meta = read_policy_meta(root)
        if not meta.get("base"):
            return "checkpoint", sums, []
        base = BaseRef.from_json(meta["base"])
        base_sums = check_base(root, base)
        detail = f"{len(base_sums)} files verified, " if base_sums else ""
        return "checkpoint", sums, [f"base {base.kind} {base.path}: {detail}hash as recorded"]
    if (root / "io_spec.json").is_file():
        from deploy_edge.bundle.files import verify_bundle

        return "export", verify_bundle(root), []
    if path.is_file():
        return "release", _verify_release(path), ["every bundle file against the manifest"]
    raise InputError(
        f"{path}: not a dataset (meta/info.json), checkpoint (policy.json), export "
        "(io_spec.json) or release file"
    )


def _verify_release(file: Path) -> dict[str, FileSum]:
    """Unpack the release ``file`` into a temporary directory, which checks every bundle file
    against its manifest's sha256 (and refuses missing, extra and unsafe members)."""
    from deploy_edge.release.header import ReleaseError
    from deploy_edge.release.manifest import read_manifest
    from deploy_edge.release.payload import extract_release

    try:
        manifest = read_manifest(file)
    except ReleaseError as err:
        raise InputError(f"{file}: not a release file ({err})") from err
    with tempfile.TemporaryDirectory(prefix="robo-pipe-verify-") as tmp:
        bundle = extract_release(file, manifest, Path(tmp) / "release")
        return {
            rel: FileSum((bundle / rel).stat().st_size, sha256)
            for rel, sha256 in manifest.files.items()
        }


def register(app: typer.Typer) -> None:
    """Add this verb to ``app``."""
    add_verb(
        app,
        verify,
        "robo-pipe verify .robo-pipe/datasets/*",
        "robo-pipe verify my-export .robo-pipe/releases/demo-policy-v1-KEYID.release --json",
    )
