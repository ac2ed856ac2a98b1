"""``robo-pipe import lerobot``: a LeRobot v3 dataset recorded elsewhere (LeRobot's own recorder
on a real arm) checked against a robot spec and registered in the home's datasets.

    check    ``meta/info.json`` and ``meta/stats.json`` against the spec, every mismatch named
             field by field in one error: the rate (the robot's control rate), the state's and
             the action's names and shapes, the cameras (the spec's, square, one size), and the
             units (each value's recorded range inside what the robot's limits allow: a state
             recorded in degrees, or an action in another convention, shows here)
    copy     the dataset into the home (hard links where the disk allows, the source never
             changed), with ``meta/checksums.json`` and ``meta/robo_pipe.json`` added, renamed
             into place whole
    open     robo-pipe's reader opens the copy (every file, every video), else it is removed
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.atomic import temporary_path
from robo_pipe.errors import InputError
from robo_pipe.integrity import file_sums, write_checksums
from robots.limits import action_fault
from robots.spec import RobotSpec
from stages.dataset.layout import (
    ACTION_KEY,
    CHECKSUMS_PATH,
    CODEBASE_VERSION,
    IMAGE_PREFIX,
    INFO_PATH,
    PROVENANCE_PATH,
    STATE_KEY,
    STATS_PATH,
    DatasetRef,
    dataset_files,
)
from stages.dataset.reader import dataset_ref
from stages.provenance import code_version


class LeRobotMismatch(InputError):
    """A LeRobot dataset that does not fit the robot (the message names each field)."""


STATE_MARGIN = 0.05
"""A state value may be this far outside its joint's range (rad or m) before it is called
out of range: a real arm's encoders read a little past its soft limits."""


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; :class:`LeRobotMismatch` naming it when missing or unreadable."""
    if not path.is_file():
        raise LeRobotMismatch(f"{path}: missing: not a LeRobot v3 dataset")
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise LeRobotMismatch(f"{path}: not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise LeRobotMismatch(f"{path}: expected a JSON object")
    return data


def mismatches(source: Path, spec: RobotSpec) -> list[str]:
    """Every way the dataset at ``source`` does not fit ``spec``, one line each ([] = fits)."""
    info = read_json(source / INFO_PATH)
    stats = read_json(source / STATS_PATH) if (source / STATS_PATH).is_file() else {}
    found: list[str] = []
    if info.get("codebase_version") != CODEBASE_VERSION:
        found.append(
            f"codebase_version = {info.get('codebase_version')!r}, expected {CODEBASE_VERSION!r}"
        )
    fps = info.get("fps")
    if not isinstance(fps, int | float) or abs(fps - spec.control_hz) > 1e-6:
        found.append(f"fps = {fps}: robot {spec.name} runs at {spec.control_hz:g} Hz")
    features: dict[str, Any] = info.get("features") or {}
    for key, names in ((STATE_KEY, spec.state_names), (ACTION_KEY, spec.action.names)):
        feature = features.get(key)
        if feature is None:
            found.append(f"features.{key}: missing")
            continue
        if list(feature.get("shape") or []) != [len(names)]:
            found.append(
                f"features.{key}.shape = {feature.get('shape')}, robot {spec.name}'s is "
                f"[{len(names)}]"
            )
        if list(feature.get("names") or []) != list(names):
            found.append(
                f"features.{key}.names = {feature.get('names')}, robot {spec.name}'s are "
                f"{list(names)}"
            )
    cameras = {
        k.removeprefix(IMAGE_PREFIX): f for k, f in features.items() if k.startswith(IMAGE_PREFIX)
    }
    known = [c.name for c in spec.cameras]
    if not cameras:
        found.append(
            f"features: no camera ({IMAGE_PREFIX}*); robot {spec.name} has {', '.join(known)}"
        )
    sizes = set()
    for camera, feature in cameras.items():
        if camera not in known:
            found.append(
                f"features.{IMAGE_PREFIX}{camera}: robot {spec.name} has no camera {camera!r} "
                f"({', '.join(known)})"
            )
        shape = list(feature.get("shape") or [])
        if len(shape) != 3 or shape[0] != shape[1] or shape[2] != 3:
            found.append(
                f"features.{IMAGE_PREFIX}{camera}.shape = {shape}: robo-pipe trains on square RGB "
                "images ([size, size, 3]); crop and resize them when recording"
            )
        else:
            sizes.add(shape[0])
    if len(sizes) > 1:
        found.append(f"features: cameras of several sizes {sorted(sizes)}: one size for all")
    found += _ranges(stats, spec)
    return found


def _ranges(stats: dict[str, Any], spec: RobotSpec) -> list[str]:
    """The recorded ranges (``stats.json`` min/max) against the robot's limits: units."""
    found: list[str] = []
    state = stats.get(STATE_KEY)
    if state and spec.arm and len(state.get("min", [])) == spec.state_dim:
        lows = [j.low for j in spec.arm] + [0.0]
        highs = [j.high for j in spec.arm] + [spec.max_gripper_opening]
        units = spec.state_units
        for k, name in enumerate(spec.state_names):
            lo, hi = float(state["min"][k]), float(state["max"][k])
            if lo < lows[k] - STATE_MARGIN or hi > highs[k] + STATE_MARGIN:
                found.append(
                    f"{STATE_KEY}[{k}] ({name}) ranges {lo:.3g}..{hi:.3g}, outside "
                    f"[{lows[k]:.3g}, {highs[k]:.3g}] {units[k]}: recorded in other units?"
                )
    action = stats.get(ACTION_KEY)
    if action and len(action.get("min", [])) == spec.action.dim:
        extremes = np.array([action["min"], action["max"]], dtype=np.float32)
        if fault := action_fault(spec, ACTION_KEY, extremes):
            found.append(f"recorded {fault}: recorded in other units, or not this robot's actions?")
    return found


def import_lerobot(source: Path, spec: RobotSpec, out: Path) -> DatasetRef:
    """The dataset at ``source``, checked against ``spec`` and registered at ``out``.

    Raises:
        LeRobotMismatch: it does not fit the robot (every mismatch, one per line).
        InputError: ``out`` exists.
    """
    if out.exists():
        raise InputError(f"{out}: exists; choose another --name or delete it")
    found = mismatches(source, spec)
    if found:
        raise LeRobotMismatch(f"{source}: does not fit robot {spec.name}:\n  " + "\n  ".join(found))
    tree = temporary_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copytree(source, tree, copy_function=_link_or_copy, ignore=_theirs_only)
        provenance = {
            "source": "lerobot",
            "imported_from": str(source.resolve()),
            "robot": spec.name,
            "code_version": code_version(),
        }
        (tree / PROVENANCE_PATH).write_text(json.dumps(provenance, indent=1))
        write_checksums(tree, file_sums(tree, dataset_files(tree)), CHECKSUMS_PATH)
        os.rename(tree, out)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    try:
        return dataset_ref(out, spec.name, "lerobot", "lerobot")
    except Exception:  # robo-pipe's reader refuses it: nothing half-registered stays
        shutil.rmtree(out, ignore_errors=True)
        raise


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link (no bytes copied; the files are never written to), a copy across disks."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _theirs_only(folder: str, names: list[str]) -> list[str]:
    """Leave out robo-pipe's own files, should the source have them (they are made anew)."""
    here = Path(folder)
    return [n for n in names if (here / n).as_posix().endswith((CHECKSUMS_PATH, PROVENANCE_PATH))]
