"""Shared fixtures: a temporary $ROBO_PIPE_HOME for every test, tiny sizes, the default robot."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from configs import config_dir
from pipelines.services.local_servers import MLFLOW_PORT_VAR, PREFECT_PORT_VAR
from robo_pipe import collector
from robots.rp5 import RP5
from robots.spec import RobotSpec, get_robot
from stages.dataset.layout import DatasetRef

NUM_ENVS = 4
"""Environments per batched env in unit tests."""

TINY_CONFIG = config_dir() / "tiny.yaml"
"""The tiny profile (``configs/tiny.yaml``, shipped): the demo at the test suite's sizes. A test
loads it, or passes it to the CLI, and overrides only the sizes it needs otherwise."""


def tiny_overrides() -> list[str]:
    """The tiny profile's own settings (``configs/tiny.yaml`` less its ``extends``) as ``--set``
    overrides, to shrink another config (``rl-demo.yaml``) to the same sizes."""

    def flatten(section: dict[str, Any], prefix: str) -> list[str]:
        sets = []
        for key, value in section.items():
            if isinstance(value, dict):
                sets += flatten(value, f"{prefix}{key}.")
            else:  # JSON is YAML: load_config reads the value back as written
                sets.append(f"{prefix}{key}={json.dumps(value)}")
        return sets

    profile = yaml.safe_load(TINY_CONFIG.read_text())
    del profile["extends"]
    return flatten(profile, "")


# Under pytest-xdist (`pytest -n 2`), each worker's `ui` and `serve` try ports of their own
# first: two workers checking 4200 at once would both find it free and one server lose it.
if worker := os.environ.get("PYTEST_XDIST_WORKER"):  # gw0, gw1, ...
    offset = 10 * (int(worker.removeprefix("gw")) + 1)
    os.environ.setdefault(PREFECT_PORT_VAR, str(4200 + offset))
    os.environ.setdefault(MLFLOW_PORT_VAR, str(5000 + offset))

SLOWEST_FIRST = (
    "tests/pipelines/test_flow.py",
    "tests/pipelines/test_cluster.py",
    "tests/pipelines/test_signals_stages.py",
    "tests/pipelines/test_schedules.py",
    "tests/pipelines/test_quickstart_champion.py",
    "tests/stages/test_rl.py",
    "tests/pipelines/test_serve.py",
    "tests/stages/test_finetune.py",
    "tests/pipelines/test_fleet.py",
    "tests/pipelines/test_serve_faults.py",
    "tests/sim_scenes/test_isaaclab_env.py",
    "tests/pipelines/test_metaworld_run.py",
    "tests/pipelines/test_cli.py",
    "tests/stages/test_evaluate.py",
    "tests/pipelines/test_deploy.py",
    "tests/pipelines/test_cli_contract.py",
    "tests/pipelines/test_shared_runs.py",
    "tests/pipelines/test_signals.py",
    "tests/pipelines/test_home_moves.py",
    "tests/pipelines/test_worker_faults.py",
    "tests/pipelines/test_integrity.py",
    "tests/pipelines/test_scale_out.py",
    "tests/stages/test_export.py",
    "tests/pipelines/test_stores.py",
)
"""The test files that take longest (per-file sums of a fresh-clone run's junit report, every
file over 45 s, slowest first): they start first, so that no worker is left running one of
them alone at the end (pyproject's ``--no-loadscope-reorder`` keeps pytest-xdist to this
order)."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the files of :data:`SLOWEST_FIRST` first, in that order (a stable sort: within a file,
    and among the other files, pytest-randomly's shuffled order stays). pytest-xdist hands the
    files to its workers in this order."""
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


_OWNED_BY_RUNNERS = {"PYTEST_CURRENT_TEST", "MUTANT_UNDER_TEST"}
"""Variables pytest and mutmut set while tests run: never restored (mutmut switches mutants
through MUTANT_UNDER_TEST; restoring it would run later tests against the original code)."""

_SESSION_ENV = {k: v for k, v in os.environ.items() if k not in _OWNED_BY_RUNNERS}
"""The environment pytest started with; every test ends by restoring it."""


@pytest.fixture
def home_path(tmp_path: Path) -> Path:
    """Where this test's $ROBO_PIPE_HOME lives (a module may share one by overriding this)."""
    return tmp_path / "home"


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """One home for a whole module whose tests build on each other's state (its registry, its
    Prefect runs); such a module overrides ``home_path`` to return it."""
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]) / "home"


@pytest.fixture(autouse=True)
def robo_pipe_home(home_path: Path) -> Iterator[Path]:
    """Every test writes its state under its own home, and leaves the environment as it found
    it: pipelines.services.settings.configure() points MLflow and Prefect at the home it runs
    in, and a value left behind would send later tests' subprocesses to another home."""
    os.environ["ROBO_PIPE_HOME"] = str(home_path)
    yield home_path
    for name in set(os.environ) - set(_SESSION_ENV) - _OWNED_BY_RUNNERS:
        del os.environ[name]
    os.environ.update(_SESSION_ENV)


@pytest.fixture(scope="module", autouse=True)
def ray_stopped_after_each_module() -> Iterator[None]:
    """Stop the Ray instance a test module started in this process (a stage on Ray workers,
    the flow) when the module's last test ends: the next module that needs Ray starts its own.

    Why: one local Ray kept for the whole session outlived dozens of actors that tests kill on
    purpose, and then, twice (a CI run, and a fresh-clone run in the test of the RL demo
    pipeline), the first call to a newly created actor waited forever: Ray's GCS logged the
    actor created, the driver never got the notice that it was alive (ray 2.60's pubsub), and
    ``ray.get`` blocked. A fresh instance per module costs a few seconds of start-up each.

    Also why not later: left to Ray's exit handler, it stops after pytest's summary, and what
    its workers report then (a worker a test killed on purpose: "A worker died ...
    SYSTEM_ERROR") printed after the summary; stopped here, whatever it still reports is
    captured with the module's last teardown."""
    yield
    ray = sys.modules.get("ray")  # never import Ray for a session that did not use it
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def rp5() -> RobotSpec:
    """The default robot, loaded once."""
    return get_robot("rp5")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> DatasetRef:
    """12 expert episodes of the demo task with a 32 px scene camera (collected once)."""
    from pipelines.config import load_config
    from stages.collect import collect

    # The fine-tuning tests learn from these: 12 episodes in two shards of 6, not the profile's 8.
    cfg = load_config(TINY_CONFIG, ["collect.episodes=12", "collect.episodes_per_shard=6"])
    out = tmp_path_factory.mktemp("tiny-dataset") / "ds"
    return collect(cfg.robot, cfg.scene, cfg.sim, cfg.collect, cfg.seed, out)


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny exported policy (32 px scene camera, rp5's sizes), made once: its checkpoint is
    ``export_dir.parent / "ckpt"``. Tests that change either copy it first."""
    import torch

    from stages.export import export
    from stages.policy.checkpoint import new_policy, save_policy
    from tests.stages.tiny_models import TINY_POLICY, rp5_normalizer

    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6, rp5_normalizer())
    root = tmp_path_factory.mktemp("export")
    save_policy(policy, root / "ckpt", None)
    return Path(export(root / "ckpt", root / "export", RP5.control_hz).path)


def _has_isaaclab() -> bool:
    from sim_scenes.isaaclab.env import IsaacLabMissingError, isaaclab_python

    try:
        isaaclab_python()
    except IsaacLabMissingError:
        return False
    return True


def needs_isaaclab(test: Callable[..., None]) -> Callable[..., None]:
    """Mark ``test`` ``isaaclab`` and skip it, naming ``make isaaclab-env``, where that
    environment is missing; ``make test`` sets ``ROBO_PIPE_ISAACLAB_PYTHON``, and then a missing
    environment fails the test instead."""
    from sim_scenes.isaaclab.env import ENV_VAR

    skip = pytest.mark.skipif(
        not _has_isaaclab() and ENV_VAR not in os.environ,
        reason="no Isaac Lab environment: create it with `make isaaclab-env`",
    )
    return pytest.mark.isaaclab(skip(test))


def _has_metaworld() -> bool:
    from sim_scenes.metaworld.env import MetaWorldMissingError, metaworld_python

    try:
        metaworld_python()
    except MetaWorldMissingError:
        return False
    return True


def needs_metaworld(test: Callable[..., None]) -> Callable[..., None]:
    """Mark ``test`` ``metaworld`` and skip it, naming ``make metaworld-env``, where that
    environment is missing; ``make test`` sets ``ROBO_PIPE_METAWORLD_PYTHON``, and then a
    missing environment fails the test instead."""
    from sim_scenes.metaworld.env import ENV_VAR

    skip = pytest.mark.skipif(
        not _has_metaworld() and ENV_VAR not in os.environ,
        reason="no Meta-World environment: create it with `make metaworld-env`",
    )
    return pytest.mark.metaworld(skip(test))


ROS_WHEELS = sys.platform == "linux" and platform.machine() == "x86_64"
"""Where ``robo-pipe[ros]`` installs rclpy (its wheels exist for x86_64 Linux only)."""


def needs_ros(test: Callable[..., None]) -> Callable[..., None]:
    """Skip ``test`` where rclpy has no wheels (``make setup`` installs it everywhere else, and
    there a missing rclpy fails the test instead)."""
    skip = pytest.mark.skipif(
        not ROS_WHEELS,
        reason=f"no rclpy wheels for {sys.platform} {platform.machine()}: source a ROS 2 install",
    )
    return skip(test)


def pytest_configure(config: pytest.Config) -> None:
    """The test processes import what ``robo-pipe`` does, and collect as it does."""
    collector.tune()
