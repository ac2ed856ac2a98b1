"""Packaging: the wheel ships the configs, the target profiles and the robots' MJCF, so a
non-editable install finds them (``benchmarks/install_smoke.py`` runs such an install); the
edge agent's imports are all in the ``edge`` extra, which a device installs."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from benchmarks.install_smoke import PACKAGES, build_wheel, wheel_files

ROOT = Path(__file__).resolve().parent.parent

# Imported only by the TensorRT engine (deploy_edge/engines.py), which runs on a Jetson, where
# JetPack provides both (deploy_edge/requirements-edge.txt says so).
JETPACK = {"tensorrt", "torch"}

# Run in a fresh interpreter: import the modules named in argv, then print the files of the
# robo-pipe modules that are loaded.
LOADED = f"""
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(
    module.__file__ for name, module in list(sys.modules.items())
    if name.split(".")[0] in {PACKAGES!r} and getattr(module, "__file__", None)
)))
"""


def test_the_wheel_ships_configs_targets_and_robot_models(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    files = wheel_files(wheel)
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml")}
    assert {"configs/demo.yaml", "configs/targets/local-cpu.yaml"} <= shipped <= files
    assert "configs/__init__.py" in files and "deploy_edge/bundle/io_spec.py" in files
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "robots").rglob("*.xml")} <= files
    assert "robots/rp5/rp5.xml" in files
    assert not any(f.startswith(("tests/", "benchmarks/")) for f in files)
    entry_points = next(f for f in files if f.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "robo-pipe = pipelines.cli:main" in archive.read(entry_points).decode()


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503): ``PyYAML>=6`` -> ``pyyaml``."""
    name = re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _edge_extra() -> list[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(pyproject["project"]["optional-dependencies"]["edge"])


def test_the_edge_requirements_file_is_the_edge_extra() -> None:
    lines = (ROOT / "deploy_edge" / "requirements-edge.txt").read_text().splitlines()
    listed = [line.split("#")[0].replace(" ", "") for line in lines]
    assert [r for r in listed if r] == [r.replace(" ", "") for r in _edge_extra()]


def test_every_import_of_the_edge_agent_is_in_the_edge_extra() -> None:
    """A device installs robo-pipe without its dependencies, then only the ``edge`` extra: every
    import statement (also those inside functions: the gate's plot) of every robo-pipe module
    the agent and its default driver (the simulated arm) load names one of its distributions."""
    from deploy_edge.agent.config import DeviceConfig

    driver = str(DeviceConfig.model_fields["driver"].default).partition(":")[0]
    # A fresh interpreter: this one has imported the whole pipeline.
    loaded = subprocess.run(
        [sys.executable, "-c", LOADED, "deploy_edge.agent.__main__", driver],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    files = json.loads(loaded.stdout.splitlines()[-1])
    assert any(f.endswith("deploy_edge/agent/service.py") for f in files)
    distributions = importlib.metadata.packages_distributions()
    declared = {_name(r) for r in _edge_extra()}
    missing: dict[str, set[str]] = {}
    for file in files:
        for node in ast.walk(ast.parse(Path(file).read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names}:
                if top in PACKAGES or top in sys.stdlib_module_names or top in JETPACK:
                    continue
                if not declared & {_name(d) for d in distributions.get(top, [top])}:
                    missing.setdefault(top, set()).add(Path(file).relative_to(ROOT).as_posix())
    assert not missing, f"imported by the edge agent, missing from the edge extra: {missing}"
