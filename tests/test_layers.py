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
METAWORLD_ONLY = {"sim_scenes/metaworld/worker.py"}
"""Modules that run only in the Meta-World environment (its worker process)."""
METAWORLD_STACK = {"metaworld"}
"""Packages of the Meta-World environment, absent from the main one (its MuJoCo is older than
ours: the main environment's ``mujoco`` is another version of the same package)."""
SIMULATOR_WORKERS = {
    "Isaac Lab": (ISAACLAB_ONLY, ISAACLAB_STACK),
    "Meta-World": (METAWORLD_ONLY, METAWORLD_STACK),
}
"""Each simulator that runs in a worker process: its worker-only modules and its packages."""


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


TOUCH_MODULES = {
    "sim_scenes.touch",
    "sim_scenes.touch_task",
    "sim_scenes.touch_words",
    "sim_scenes.expert",
}
"""The touch task family's own modules: the rest of the pipeline reaches them through the task
registry (:mod:`sim_scenes.tasks`: ``resolve_task``, the family's methods and the records they
return, such as ``episode_words``), so that another family plays the same stages."""
NOT_YET_THROUGH_THE_SEAM = {
    "stages/evaluate/config.py": "evaluate.phrasing is touch's Phrasing",
    "stages/evaluate/shards.py": "the phrasing an evaluation worker passes on",
}
"""Modules outside ``sim_scenes/`` that still import the touch family directly, and why (issue
50 moves each behind the registry; the list only shrinks)."""


def touch_imports(path: Path) -> set[str]:
    """The touch family's modules (:data:`TOUCH_MODULES`) that ``path`` imports, however it
    spells it (``from sim_scenes import touch_words`` too), at module level or in a function."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
    return {t for t in TOUCH_MODULES for m in modules if m == t or m.startswith(t + ".")}


def test_the_stages_reach_the_touch_task_only_through_the_task_registry() -> None:
    reached = {}
    for package in sorted(MAY_IMPORT.keys() - {"sim_scenes"}):
        for path in sorted((ROOT / package).rglob("*.py")):
            touched = touch_imports(path)
            if touched:
                reached[str(path.relative_to(ROOT))] = sorted(touched)
    assert set(reached) == set(NOT_YET_THROUGH_THE_SEAM), reached


def test_the_seam_check_sees_each_spelling_of_a_touch_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    for line, expected in [
        ("from sim_scenes.touch_words import layout_words", {"sim_scenes.touch_words"}),
        ("from sim_scenes import touch_words, tasks", {"sim_scenes.touch_words"}),
        ("import sim_scenes.touch_task as t", {"sim_scenes.touch_task"}),
        ("def f():\n    from sim_scenes.touch import get_variant", {"sim_scenes.touch"}),
        ("from sim_scenes.tasks import resolve_task\nimport sim_scenes.touchstone", set()),
    ]:
        sample.write_text(line + "\n")
        assert touch_imports(sample) == expected, line


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from prefect import flow\nimport pipelines.steps\nfrom . import x\n")
    assert imported_packages(sample) == {"prefect", "pipelines"}


@pytest.mark.parametrize("simulator", sorted(SIMULATOR_WORKERS))
def test_the_main_environment_never_imports_a_worker_simulator(simulator: str) -> None:
    """Only the worker's modules import the simulator's stack at module level, and no module the
    main environment loads imports those (its backend talks to them over a socket)."""
    only, stack = SIMULATOR_WORKERS[simulator]
    worker_modules = {p.removesuffix(".py").replace("/", ".") for p in only}
    broken = {}
    for folder in [*MAY_IMPORT, "tests", "benchmarks"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if str(path.relative_to(ROOT)) in only:
                continue
            tree = ast.parse(path.read_text(), str(path))
            top_level = set()
            for node in tree.body:  # function-level imports run only where they are called
                if isinstance(node, ast.Import):
                    top_level |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    top_level.add(node.module)
            wrong = {m for m in top_level if m.split(".")[0] in stack}
            wrong |= top_level & worker_modules
            if wrong:
                broken[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not broken, f"{simulator} imported outside its worker: {broken}"


TOP_WINGS = {
    "pipelines.cli": "the CLI: the top of pipelines/, over the steps, flows and deploys",
    "deploy_edge.agent": "the edge agent: the device's service, over the bundle and runtime",
    "deploy_edge.policy_client": "the robot's side of the policy server, over the runtime",
}
"""Sub-packages that sit a floor above the rest of their package: nothing else in the package
imports them (their own modules and the tests do), so the floor below runs without them."""


def module_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Each of our modules (dotted name) -> our modules it imports, at module level or inside a
    function (a lazy import still runs up the floor or closes a circle)."""
    modules = {}
    for package in OURS:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{alias.name}" for alias in node.names}
        found = {ours(t) for t in targets if t.split(".")[0] in OURS}
        graph[name] = {t for t in found if t is not None and t != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of imports: the strongly connected components of more than one module."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in graph.get(module, ()):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return circles


def test_no_import_circle_even_through_a_lazy_import() -> None:
    assert import_circles(module_imports()) == []


def test_nothing_imports_up_a_floor_into_a_top_wing() -> None:
    broken = {}
    for module, targets in module_imports().items():
        for wing in TOP_WINGS:
            package = wing.split(".")[0]
            inside = module == wing or module.startswith(wing + ".")
            if module.split(".")[0] == package and not inside:
                up = sorted(t for t in targets if t == wing or t.startswith(wing + "."))
                if up:
                    broken[module] = up
    assert not broken, f"imports up a floor: {broken}"


def test_the_circle_and_floor_checks_see_a_lazy_import(tmp_path: Path) -> None:
    for package in OURS:
        (tmp_path / package).mkdir()
    (tmp_path / "pipelines" / "cli").mkdir()
    (tmp_path / "pipelines" / "cli" / "__init__.py").write_text("from pipelines.cli import verbs\n")
    (tmp_path / "pipelines" / "cli" / "verbs.py").write_text(
        "def f():\n    from pipelines.cli import report\n"
    )
    (tmp_path / "pipelines" / "steps.py").write_text("def g():\n    import pipelines.cli.verbs\n")
    graph = module_imports(tmp_path)
    assert import_circles(graph) == [["pipelines.cli", "pipelines.cli.verbs"]]
    assert graph["pipelines.steps"] == {"pipelines.cli.verbs"}


ROS_STACK = {"rclpy", "std_msgs", "sensor_msgs", "rosbags"}
"""ROS 2 (an optional extra): only its one module imports it."""
ROS_ONLY = {"robots/ros2/node.py"}


def test_only_the_ros2_node_module_imports_ros() -> None:
    """rclpy is an optional extra (``robo-pipe[ros]``): one module imports it (and names the fix
    where it is missing), the driver and the twin reach it through that module, and nothing
    else in the tree imports either of those at module level."""
    ros_modules = {"robots.ros2.node", "robots.ros2.driver", "sim_scenes.twin"}
    broken = {}
    for folder in [*MAY_IMPORT, "tests", "benchmarks"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name in ROS_ONLY:
                continue
            tree = ast.parse(path.read_text(), name)
            top_level = set()
            for node in tree.body:
                if isinstance(node, ast.Import):
                    top_level |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    top_level.add(node.module)
            wrong = {m for m in top_level if m.split(".")[0] in ROS_STACK - {"rosbags"}}
            if name.removesuffix(".py").replace("/", ".") not in ros_modules:
                wrong |= top_level & ros_modules
            if wrong:
                broken[name] = sorted(wrong)
    assert not broken, f"ROS 2 imported outside robots/ros2/node.py: {broken}"
