"""Packaging: the wheel ships the configs, the target profiles and the robots' MJCF, so a
non-editable install finds them (``benchmarks/install_smoke.py`` runs such an install)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from benchmarks.install_smoke import build_wheel, wheel_files

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_configs_targets_and_robot_models(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    files = wheel_files(wheel)
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml")}
    assert {"configs/demo.yaml", "configs/targets/local-cpu.yaml"} <= shipped <= files
    assert "configs/__init__.py" in files and "deploy_edge/bundle.py" in files
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "robots").rglob("*.xml")} <= files
    assert "robots/rp5/rp5.xml" in files
    assert not any(f.startswith(("tests/", "benchmarks/")) for f in files)
    entry_points = next(f for f in files if f.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "robo-pipe = pipelines.cli:main" in archive.read(entry_points).decode()
