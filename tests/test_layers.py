"""The layer rule of README's Architecture section, checked on every import in the tree:
which of robo-pipe's packages each package may import, and which third-party stacks stay out
of the layers that must run without them (the stages and the edge runtime without Prefect and
MLflow)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"robo_pipe", "configs", "robots", "sim_scenes", "deploy_edge", "stages", "pipelines"}
MAY_IMPORT = {
    "robo_pipe": set(),
    "configs": set(),
    "robots": {"robo_pipe"},
    "sim_scenes": {"robots", "robo_pipe"},
    "deploy_edge": {"robots", "robo_pipe", "configs"},
    "stages": {"sim_scenes", "robots", "deploy_edge", "robo_pipe"},
    "pipelines": OURS,
}
KEPT_OUT = {
    "stages": {"prefect", "mlflow"},
    "sim_scenes": {"prefect", "mlflow", "torch"},
    "robots": {"prefect", "mlflow", "torch"},
    "deploy_edge": {"prefect", "mlflow"},  # torch: only the TensorRT engine's CUDA buffers
}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (absolute imports; ours are all)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_what_its_layer_allows(package: str) -> None:
    allowed = MAY_IMPORT[package] | {package}
    broken = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        imported = imported_packages(path)
        wrong = (imported & OURS) - allowed
        wrong |= imported & KEPT_OUT.get(package, set())
        if wrong:
            broken[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not broken, f"imports across the layers: {broken}"


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from prefect import flow\nimport pipelines.steps\nfrom . import x\n")
    assert imported_packages(sample) == {"prefect", "pipelines"}
