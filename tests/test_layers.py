"""The layer rule of docs/architecture.md, checked on every import in the tree:
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
ISAACLAB_ONLY = {
    "sim_scenes/isaaclab/touch_env.py",
    "sim_scenes/isaaclab/touch_env_cfg.py",
    "sim_scenes/isaaclab/worker.py",
}
"""Modules that run only in the Isaac Lab environment (its worker process): they import Isaac
Lab and its torch, so the third-party rule (KEPT_OUT) does not apply to them; the rule between
our packages does."""
ISAACLAB_STACK = {"isaaclab", "isaaclab_newton", "isaaclab_tasks", "newton", "warp", "pxr"}
"""Packages of the Isaac Lab environment, absent from the main one."""


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
        if str(path.relative_to(ROOT)) not in ISAACLAB_ONLY:
            wrong |= imported & KEPT_OUT.get(package, set())
        if wrong:
            broken[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not broken, f"imports across the layers: {broken}"


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from prefect import flow\nimport pipelines.steps\nfrom . import x\n")
    assert imported_packages(sample) == {"prefect", "pipelines"}


def test_the_main_environment_never_imports_isaac_lab() -> None:
    """Only the worker's modules import Isaac Lab's stack at module level, and no module the
    main environment loads imports those (the backend talks to them over a socket)."""
    worker_modules = {p.removesuffix(".py").replace("/", ".") for p in ISAACLAB_ONLY}
    broken = {}
    for folder in [*MAY_IMPORT, "tests", "benchmarks"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if str(path.relative_to(ROOT)) in ISAACLAB_ONLY:
                continue
            tree = ast.parse(path.read_text(), str(path))
            top_level = set()
            for node in tree.body:  # function-level imports run only where they are called
                if isinstance(node, ast.Import):
                    top_level |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    top_level.add(node.module)
            wrong = {m for m in top_level if m.split(".")[0] in ISAACLAB_STACK}
            wrong |= top_level & worker_modules
            if wrong:
                broken[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not broken, f"Isaac Lab imported outside its worker: {broken}"
