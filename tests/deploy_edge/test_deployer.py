"""The edge agent's deployer on real release files of a tiny exported policy and the simulated
rp5: a deployment goes live through every step; a release for another target, a failing parity,
gate or health check (deadline misses alone, an engine error alone) leaves the old version
active; releases below the floor (the highest ever installed, kept through a rollback and a
restart) and expired ones need force; lost state is reported; a robot-busy lock stages a version
until it is released; ``kill -9`` at any step leaves the old version complete after recovery."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import pytest
from fastapi.testclient import TestClient

from deploy_edge.agent.config import (
    DeviceConfig,
    DeviceConfigError,
    load_device_config,
    load_driver,
)
from deploy_edge.agent.deployer import Deployer, DeployError
from deploy_edge.agent.service import create_app
from deploy_edge.bundle.files import bundle_files, write_bundle_checksums
from deploy_edge.client import AgentClient
from deploy_edge.device import DeviceEntry
from deploy_edge.keys import generate_keypair, load_private_key
from deploy_edge.release.signature import write_release
from deploy_edge.wire import STEPS, Deployment, DeviceStatus, Origin
from robo_pipe.integrity import file_sha256
from robots.spec import get_robot
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import SceneError, get_variant
from tests.deploy_edge.narrow_robot import RATED

ROOT = Path(__file__).resolve().parents[2]
TOKEN_SHA = "a" * 64
SHARED_CPU = Path(__file__).with_name("shared-cpu.yaml")
"""The tests' device profile: local-cpu tolerating the suite's stalls (the file says why)."""
FLAKY = "tests.deploy_edge.test_deployer:flaky_rp5"


class BreakingRobot(SimulatedRobot):
    """The simulated rp5 whose servos fail (``act`` raises) after ``break_after`` actions."""

    def __init__(self, cameras: tuple[str, ...], image_size: int, break_after: int) -> None:
        super().__init__(get_robot("rp5"), get_variant("touch-mixed"), 0, cameras, image_size)
        self.acts, self.break_after = 0, break_after

    def act(self, action: np.ndarray) -> None:
        self.acts += 1
        if self.acts > self.break_after:
            raise RuntimeError("servo 3 fault")
        super().act(action)


class FlakyFactory:
    """A driver factory: its first robot (the gate's) works, later ones (the health check's)
    fail after 3 actions."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, cameras: tuple[str, ...], image_size: int) -> SimulatedRobot:
        self.calls += 1
        return BreakingRobot(cameras, image_size, 10**9 if self.calls == 1 else 3)


flaky_rp5 = FlakyFactory()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return generate_keypair(tmp_path_factory.mktemp("keys"), "release")


@pytest.fixture(scope="module")
def releases(
    tmp_path_factory: pytest.TempPathFactory, export_dir: Path, keys: tuple[Path, Path]
) -> Callable[..., Path]:
    """``make(release, **write_release options)``: a signed release file of the tiny export."""
    out = tmp_path_factory.mktemp("releases")
    private = load_private_key(keys[0])
    made: dict[str, Path] = {}

    def make(release: int, **options: Any) -> Path:
        name = f"r{release}-" + "-".join(f"{k}={v}" for k, v in sorted(options.items()))
        if name not in made:
            made[name] = out / f"{len(made)}.release"
            write_release(
                export_dir,
                made[name],
                private,
                model_name="tiny",
                model_version=str(release),
                run_id="run-1",
                release=release,
                **options,
            )
        return made[name]

    return make


def device_config(state_dir: Path, pub: Path, **overrides: Any) -> DeviceConfig:
    options: dict[str, Any] = {
        "name": "dev-1",
        "tokens": {"operate": [TOKEN_SHA]},
        "trusted_keys": [pub],
        "state_dir": state_dir,
        "target": str(SHARED_CPU),
        "gate_steps": 100,
        "gate_warmup": 5,
        "pace": False,
        "health_ticks": 10,
        **overrides,
    }
    return DeviceConfig(**options)


def _sha(token: str) -> str:
    """The sha256 a device config lists for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def base_state(
    tmp_path_factory: pytest.TempPathFactory,
    keys: tuple[Path, Path],
    releases: Callable[..., Path],
) -> Path:
    """A state directory where release 1 was deployed (active; no previous)."""
    state = tmp_path_factory.mktemp("base") / "state"
    deployer = Deployer(device_config(state, keys[1]))
    assert deployer.recover() == []
    done = deployer.deploy(releases(1))
    assert done.state == "active", done.reason
    status = deployer.status()
    assert status.active is not None and status.active.release == 1
    assert status.previous is None and status.staged is None
    return state


@pytest.fixture
def state(base_state: Path, tmp_path: Path) -> Path:
    """A copy of the base state (release 1 active) for one test."""
    copy = tmp_path / "state"
    shutil.copytree(base_state, copy, symlinks=True)
    return copy


def slot_entries(state: Path) -> set[str]:
    return {p.name for p in (state / "slots").iterdir()}


def assert_only_release_1(deployer: Deployer, state: Path) -> None:
    """Release 1 is active and complete; nothing else is left in the slots."""
    status = deployer.status()
    assert status.active is not None and status.active.release == 1
    active = Path(status.active.path)
    manifest = json.loads((active.parent / "manifest.json").read_text())
    assert {p.as_posix() for p in bundle_files(active)} == set(manifest["files"])
    name = active.parent.name
    assert slot_entries(state) == {name, f"{name}.json"}
    assert not list(state.glob(".*.tmp"))


def test_a_release_goes_live_through_every_step_and_runs_an_episode(
    state: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    deployer = Deployer(device_config(state, keys[1]))
    seen: list[Deployment] = []
    done = deployer.deploy(releases(2), on_step=seen.append)
    assert done.state == "active" and done.reason == "" and done.forced == []
    assert [s.name for s in done.steps] == list(STEPS)
    assert all(s.ok and s.seconds >= 0 for s in done.steps), done.steps
    assert [len(d.steps) for d in seen] == [*range(1, len(STEPS) + 1), len(STEPS)]
    assert done.gate is not None and done.gate.p99_ms <= done.gate.budget_ms == 100.0
    assert (done.model_name, done.model_version, done.release) == ("tiny", "2", 2)

    status = deployer.status()
    assert status.device == "dev-1" and status.target == "local-cpu" and not status.locked
    assert status.active is not None and status.active.release == 2
    assert status.active.sha256 == done.release_sha256
    assert status.previous is not None and status.previous.release == 1
    assert status.running is None and status.last == done
    assert deployer.history()[0] == done and [d.release for d in deployer.history()] == [2, 1]
    assert os.readlink(state / "active").startswith("slots/2-")
    assert len(slot_entries(state)) == 4, "active and previous, each with its record"

    episode = deployer.run_episode("touch the red cube", max_ticks=15)
    assert episode.version == "tiny:2" and 1 <= episode.ticks <= 15
    assert episode.success in (True, False) and episode.errors == 0
    assert 0 < episode.p50_ms <= episode.p99_ms

    with pytest.raises(DeployError, match=r"release 7 is not the previous version.*release 1"):
        deployer.rollback(release=7)  # names what the device holds; nothing changes
    assert deployer.status().active == status.active
    asked = Origin(by="fleet", rollout="r-42", flow_run="http://prefect/runs/f-1")
    back = deployer.rollback(release=1, origin=asked)
    assert back.state == "rolled_back" and back.release == 1 and back.origin == asked
    assert "from tiny:2 (release 2) to tiny:1 (release 1) (by fleet, rollout r-42" in back.reason
    assert deployer.history()[0].origin == asked, "the history keeps who asked"
    status = deployer.status()
    assert status.active is not None and status.active.release == 1
    # the rollback target rule: never the version rolled back from (v0 is long gone)
    assert status.previous is None, status.previous
    assert len(slot_entries(state)) == 2, "the version rolled back from is deleted"
    with pytest.raises(DeployError, match="no previous version"):
        deployer.rollback()  # a second rollback never re-activates release 2
    assert deployer.status().active == status.active
    assert deployer.recover() == [], "nothing to recover after finished deployments"


def test_a_failing_gate_is_refused_and_the_old_version_stays(
    state: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    deployer = Deployer(device_config(state, keys[1]))
    done = deployer.deploy(releases(2, budget_ms=0.0001))
    assert done.state == "refused"
    assert done.reason.startswith("gate: p99 ") and "> budget 0.0001 ms" in done.reason
    assert [s.name for s in done.steps] == ["verify", "extract", "engine", "parity", "gate"]
    assert not done.steps[-1].ok and done.gate is not None and done.gate.budget_ms == 0.0001
    assert deployer.status().last == done
    assert_only_release_1(deployer, state)


def test_a_device_whose_robot_runs_at_another_rate_refuses_the_release_before_any_tick(
    state: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    """The bundle was made for rp5's 10 Hz; the device's robot runs at 25 Hz: the gate step
    names both rates and measures nothing, and release 1 stays."""
    deployer = Deployer(device_config(state, keys[1], driver=RATED))
    done = deployer.deploy(releases(2))
    assert done.state == "refused" and done.steps[-1].name == "gate", done.steps
    assert "robot 'rp5' runs at 25 Hz but the bundle was made for 10 Hz" in done.reason
    assert done.gate is None, "no tick was measured"
    assert_only_release_1(deployer, state)


def test_a_failing_health_check_rolls_back_to_the_previous_version(
    state: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    deployer = Deployer(device_config(state, keys[1], driver=FLAKY))
    assert deployer.driver is flaky_rp5
    flaky_rp5.calls = 0
    done = deployer.deploy(releases(2))
    assert done.state == "rolled_back"
    assert done.reason == "health: RuntimeError: servo 3 fault"
    assert [(s.name, s.ok) for s in done.steps][-3:] == [
        ("gate", True),
        ("activate", True),
        ("health", False),
    ]
    status = deployer.status()
    assert status.last == done and status.previous is None
    assert_only_release_1(deployer, state)


def test_a_shadow_health_check_computes_actions_without_sending_them(
    state: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    """The same failing servos, in shadow mode (a real arm's setting): nothing is sent, so the
    health check sees only the policy and the version goes live."""
    deployer = Deployer(device_config(state, keys[1], driver=FLAKY, shadow_health=True))
    flaky_rp5.calls = 0
    done = deployer.deploy(releases(2))
    assert done.state == "active", done.reason
    active = deployer.status().active
    assert active is not None and active.release == 2


def test_downgrades_and_expired_releases_need_force_and_are_recorded(
    state: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    deployer = Deployer(device_config(state, keys[1]))
    expired = releases(3, expires_in_days=1.0, now=datetime.now(UTC) - timedelta(days=2))
    refused = deployer.deploy(expired)
    assert refused.state == "refused" and refused.reason.startswith("verify: expired: ")
    assert [s.name for s in refused.steps] == ["verify"]
    forced = deployer.deploy(expired, force=True)
    assert forced.state == "active" and forced.forced == ["expired"]
    assert "forced past: expired" in forced.steps[0].detail
    status = deployer.status()  # expiry is an install rule: the robot keeps running it
    assert status.active is not None and status.active.expires_at is not None
    assert status.notices == [
        f"the active release tiny:3 (release 3) expired at {status.active.expires_at}; it keeps "
        "running (expiry is checked at install): deploy a newer release"
    ]

    older = releases(2)
    refused = deployer.deploy(older)
    assert refused.state == "refused" and refused.reason.startswith("verify: downgrade: ")
    forced = deployer.deploy(older, force=True)
    assert forced.state == "active" and forced.forced == ["downgrade"]
    status = deployer.status()
    assert status.active is not None and status.active.release == 2
    assert status.previous is not None and status.previous.release == 3
    again = deployer.deploy(older, force=True)
    assert again.state == "refused" and "already the active version" in again.reason
    assert [d.state for d in deployer.history()] == [
        "refused",
        "active",
        "refused",
        "active",
        "refused",
        "active",
    ]


def test_untrusted_and_target_mismatched_releases_are_refused(
    state: Path, tmp_path: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    _, other_pub = generate_keypair(tmp_path / "other", "other")
    deployer = Deployer(device_config(state, other_pub))
    done = deployer.deploy(releases(2))
    assert done.state == "refused" and done.reason.startswith("verify: untrusted-key: ")
    deployer = Deployer(device_config(state, other_pub, trusted_keys=[]))
    assert deployer.deploy(releases(2)).reason.startswith("verify: no-trusted-keys: ")

    deployer = Deployer(device_config(state, keys[1]))  # genuine, for another device
    done = deployer.deploy(releases(2, targets=["jetson-orin"]))
    assert done.state == "refused" and [s.name for s in done.steps] == ["verify"]
    assert done.reason == (
        "verify: release is for targets ['jetson-orin'], this device is 'local-cpu'"
    )
    assert_only_release_1(deployer, state)
    done = deployer.deploy(releases(2, targets=["jetson-orin", "local-cpu"]))
    assert done.state == "active", done.reason


def test_a_release_whose_reference_outputs_disagree_with_its_model_is_refused_at_parity(
    state: Path, tmp_path: Path, keys: tuple[Path, Path], export_dir: Path
) -> None:
    """Genuinely signed, but its reference.npz says the model should act 0.01 off what it
    does (an export bug): refused at the parity step, before anything changes."""
    bundle = tmp_path / "bundle"
    shutil.copytree(export_dir, bundle)
    reference = dict(np.load(bundle / "reference.npz"))
    reference["expected_actions"] = reference["expected_actions"] + 0.01
    np.savez(bundle / "reference.npz", **reference)
    write_bundle_checksums(bundle)
    release = tmp_path / "off.release"
    private = load_private_key(keys[0])
    write_release(
        bundle, release, private, model_name="tiny", model_version="2", run_id="r", release=2
    )
    done = Deployer(device_config(state, keys[1])).deploy(release)
    assert done.state == "refused"
    assert [(s.name, s.ok) for s in done.steps][-2:] == [("engine", True), ("parity", False)]
    assert done.reason.startswith("parity: max |error| 1.00e-02 > tolerance 0.0001 on reference")
    assert_only_release_1(Deployer(device_config(state, keys[1])), state)


class FaultyPolicy:
    """The active version's policy with a fault in its inference: ``delay_s`` before each (a
    slow engine: deadline misses, no error), ``error`` raised (an engine error, on time) or
    ``emit`` (NaN, inf, 7.1 rad) as the first action's first component (a policy emitting it)."""

    def __init__(
        self, policy: Any, delay_s: float = 0.0, error: str = "", emit: float | None = None
    ) -> None:
        self.policy, self.delay_s, self.error, self.emit = policy, delay_s, error, emit

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.delay_s)
        if self.error:
            raise RuntimeError(self.error)
        chunk = self.policy.infer(*args, **kwargs)
        if self.emit is not None:
            chunk[:, 0, 0] = self.emit
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"delay_s": 0.12}, "health: 3 deadline misses, 0 engine errors in 3 ticks"),
        (
            {"error": "CUDA error: an illegal memory access"},
            "health: 3 deadline misses, 3 engine errors in 3 ticks "
            "(first: RuntimeError: CUDA error: an illegal memory access)",
        ),
        (
            {"emit": math.nan},
            "health: 3 deadline misses, 0 engine errors, 3 unsafe values refused in 3 "
            "ticks (first: action[0, 0] = nan)",
        ),
        (
            {"emit": 7.1},
            "health: 3 deadline misses, 0 engine errors, 3 unsafe values refused in 3 "
            "ticks (first: action[0, 0] = 7.1 rad: beyond joint base_yaw's travel of 5.6 rad)",
        ),
    ],
    ids=["deadline-misses", "engine-error", "non-finite", "beyond-travel"],
)
def test_a_health_check_with_misses_or_engine_errors_rolls_back(
    fault: dict[str, Any],
    reason: str,
    state: Path,
    keys: tuple[Path, Path],
    releases: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate passes (its engine is fine); the active version's engine, which the health
    check runs, is slow past the 100 ms deadline of local-cpu's 10 Hz, raises, or emits NaN or
    a delta beyond its joint's travel: each alone rolls back, with that reason."""
    from deploy_edge.agent import active as module

    real = module.open_policy
    monkeypatch.setattr(module, "open_policy", lambda *args: FaultyPolicy(real(*args), **fault))
    deployer = Deployer(device_config(state, keys[1], health_ticks=3))
    done = deployer.deploy(releases(2))
    assert done.state == "rolled_back" and done.reason == reason
    assert [(s.name, s.ok) for s in done.steps][-3:] == [
        ("gate", True),
        ("activate", True),
        ("health", False),
    ]
    assert deployer.status().previous is None
    assert_only_release_1(deployer, state)


@contextlib.contextmanager
def agent_client(config: DeviceConfig, token_env: str) -> Iterator[AgentClient]:
    """The deploy client (what ``robo-pipe deploy`` runs, its token in ``token_env``) on a
    fresh agent over ``config``, the agent's HTTP endpoints served in-process by FastAPI's
    TestClient (a new agent each time: a restart)."""
    client = AgentClient(DeviceEntry(name="dev-1", url="http://agent", token_env=token_env))
    with TestClient(create_app(config, Deployer(config)), base_url="http://agent") as http:
        http.headers.update(client.http.headers)  # the bearer token
        client.http = cast(Any, http)  # the same requests API, on the app instead of a socket
        yield client


def test_the_release_floor_survives_a_rollback_and_a_restart(
    state: Path,
    keys: tuple[Path, Path],
    releases: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack, through the agent's endpoints: roll back, then install an older genuine
    release. The floor is the highest release ever installed, not the active one: refused
    without force, after a restart too."""
    token = "operate-token"  # deploys, and may force
    config = device_config(state, keys[1], tokens={"operate": [_sha(token)]})
    monkeypatch.setenv("DEV_TOKEN", token)

    def send(client: AgentClient, release: Path) -> str:
        sha = file_sha256(release)
        client.upload(release, sha)
        return sha

    with agent_client(config, "DEV_TOKEN") as agent:
        assert agent.status().floor == {"tiny": 1} and agent.status().notices == []
        assert agent.deploy(send(agent, releases(3)), poll_s=0.02).state == "active"
        assert agent.rollback().release == 1
        status = agent.status()
        assert status.active is not None and status.active.release == 1
        assert status.floor == {"tiny": 3}, "a rollback does not lower the floor"

    with agent_client(config, "DEV_TOKEN") as agent:  # the agent restarts
        assert agent.status().floor == {"tiny": 3} and agent.status().notices == []
        older = send(agent, releases(2))
        refused = agent.deploy(older, poll_s=0.02)
        assert refused.state == "refused" and [s.name for s in refused.steps] == ["verify"]
        assert refused.reason == (
            "verify: downgrade: release 2 of tiny is below the device's floor 3, the highest "
            "release of it ever installed (a downgrade; force to go back on purpose)"
        )
        forced = agent.deploy(older, force=True, poll_s=0.02)
        assert forced.state == "active" and forced.forced == ["downgrade"]
        assert "forced past: downgrade (floor 3)" in forced.steps[0].detail
        assert agent.status().floor == {"tiny": 3}, "a forced downgrade does not lower it"
        newest = agent.deploy(send(agent, releases(3)), poll_s=0.02)
        assert newest.state == "active", "the floor's own release installs"


def test_lost_state_is_reported_at_start_not_silently_reset(
    state: Path,
    tmp_path: Path,
    keys: tuple[Path, Path],
    releases: Callable[..., Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A state directory that has deployed but lost its floor record (deleted, unreadable)
    rebuilds it from the history and says so, at start in the log and in ``GET /status``; a
    state directory that cannot be used stops the agent at start (one line, exit 2); a
    missing one is reported."""
    token = "read-token"
    tokens = {"read": [_sha(token)]}
    config = device_config(state, keys[1], tokens=tokens)
    assert Deployer(config).deploy(releases(3)).state == "active"
    assert Deployer(config).rollback().release == 1

    (state / "floor.json").unlink()
    with caplog.at_level(logging.WARNING, logger="deploy_edge.agent"):
        deployer = Deployer(config)
    missing = (
        f"release floor {state.absolute() / 'floor.json'} is missing although this device has "
        "deployed before: rebuilt from its history and slots (tiny 3)"
    )
    assert caplog.messages == [deployer.status().notices[0]]
    assert deployer.status().notices[0].startswith(missing)
    with TestClient(create_app(config, deployer)) as agent:
        answer = agent.get("/status", headers={"Authorization": f"Bearer {token}"})
    status = DeviceStatus.from_json(answer.json())
    assert status.floor == {"tiny": 3} and status.notices[0].startswith(missing)
    assert deployer.deploy(releases(2)).reason.startswith("verify: downgrade: ")

    (state / "floor.json").write_text("{torn")
    notices = Deployer(config).status().notices
    assert (
        notices[0].startswith("release floor ")
        and " is unreadable (JSONDecodeError: " in notices[0]
    )

    unusable = tmp_path / "not-a-dir"  # e.g. a mount that failed, leaving a file
    unusable.write_text("")
    config_file = tmp_path / "device.yaml"
    config_file.write_text(json.dumps(device_config(unusable, keys[1]).model_dump(mode="json")))
    start = [sys.executable, "-m", "deploy_edge.agent", "--config", str(config_file)]
    proc = subprocess.run(start, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: field 'state_dir' = '{unusable}': cannot hold the ")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr

    lost = Deployer(device_config(tmp_path / "wiped", keys[1]))
    assert lost.status().floor == {}
    assert lost.status().notices == [
        f"state directory {(tmp_path / 'wiped').absolute()} did not exist and was created "
        "empty: no release floor (on a first start that is expected; otherwise the device's "
        "state was lost and an older release would install without force)"
    ]


def test_the_robot_busy_lock_stages_the_version_until_it_is_released(
    state: Path, tmp_path: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    lock = tmp_path / "robot-busy"
    lock.touch()
    deployer = Deployer(device_config(state, keys[1], lock_file=lock))
    done = deployer.deploy(releases(2))
    assert done.state == "staged" and "robot busy" in done.reason
    assert [s.name for s in done.steps] == list(STEPS[:5])
    status = deployer.status()
    assert status.locked and status.staged is not None and status.staged.release == 2
    assert status.active is not None and status.active.release == 1
    assert deployer.activate_staged() is None, "still locked"
    newer = deployer.deploy(releases(3))
    assert newer.state == "staged", "a newer release replaces the staged one"
    staged = deployer.status().staged
    assert staged is not None and staged.release == 3
    assert len(slot_entries(state)) == 4, "active and staged, each with its record"

    lock.unlink()
    live = deployer.activate_staged()
    assert live is not None and live.id == newer.id and live.state == "active"
    assert [s.name for s in live.steps] == list(STEPS) and all(s.ok for s in live.steps)
    status = deployer.status()
    assert not status.locked and status.staged is None
    assert status.active is not None and status.active.release == 3
    assert status.previous is not None and status.previous.release == 1
    history = deployer.history()
    assert [(d.release, d.state) for d in history] == [(3, "active"), (2, "refused"), (1, "active")]
    assert history[1].reason == f"superseded by deployment {newer.id} before it was activated"
    assert deployer.activate_staged() is None, "nothing staged"


def test_unstage_drops_the_staged_version_and_records_who_asked(
    state: Path, tmp_path: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    lock = tmp_path / "robot-busy"
    lock.touch()
    deployer = Deployer(device_config(state, keys[1], lock_file=lock))
    staged = deployer.deploy(releases(2))
    assert staged.state == "staged" and len(slot_entries(state)) == 4
    asked = Origin(by="cli")
    dropped = deployer.unstage(origin=asked)
    assert dropped.id == staged.id and dropped.state == "unstaged" and dropped.origin == asked
    assert dropped.reason == "unstaged before it was activated (by cli)"
    assert_only_release_1(deployer, state)  # its slot deleted, the active one untouched
    assert deployer.history()[0] == dropped and deployer.status().staged is None
    with pytest.raises(DeployError, match="nothing staged"):
        deployer.unstage()
    lock.unlink()
    assert deployer.activate_staged() is None, "nothing left to activate"
    assert deployer.recover() == []


CRASH = """
import sys
from deploy_edge.agent.config import load_device_config
from deploy_edge.agent.deployer import Deployer
Deployer(load_device_config(sys.argv[1])).deploy(sys.argv[2])
print("not killed")
"""


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_any_step_leaves_the_old_version_complete(
    step: str,
    state: Path,
    tmp_path: Path,
    keys: tuple[Path, Path],
    releases: Callable[..., Path],
) -> None:
    config_file = tmp_path / "device.yaml"
    config = device_config(state, keys[1]).model_dump(mode="json")
    config_file.write_text(json.dumps(config))
    env = {**os.environ, "ROBO_PIPE_AGENT_CRASH_AT": step}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(config_file), str(releases(2))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr

    (state / "slots" / ".2-0123456789ab.staging-x").mkdir()  # as a cut-off extraction leaves
    os.symlink("slots", state / ".active.4242.tmp")  # as a cut-off link flip leaves
    deployer = Deployer(load_device_config(config_file))
    notes = deployer.recover()
    assert any("interrupted at step " + repr(step) in n for n in notes), notes
    assert_only_release_1(deployer, state)
    status = deployer.status()
    assert status.previous is None and status.staged is None and status.running is None
    last = deployer.history()[0]
    assert last.state == "interrupted" and last.reason.startswith(f"step '{step}'")
    assert deployer.recover() == [], "recovery is done once"
    if step == "health":  # the release deploys after a recovery
        assert deployer.deploy(releases(2)).state == "active"


def test_device_config_resolves_relative_paths_and_names_bad_fields(tmp_path: Path) -> None:
    file = tmp_path / "device.yaml"
    file.write_text(
        f"name: cell-3\ntokens: {{read: [{TOKEN_SHA}]}}\nstate_dir: state\n"
        "trusted_keys: [keys/a.pub]\nlock_file: run/busy\n"
    )
    config = load_device_config(file)
    assert config.state_dir == tmp_path / "state" and config.lock_file == tmp_path / "run/busy"
    assert config.trusted_keys == [tmp_path / "keys/a.pub"]
    assert config.listen == "127.0.0.1:8765" and config.target == "local-cpu"
    with pytest.raises(DeviceConfigError, match=r"device.yaml: field 'tokens.read' = \['abc'\]"):
        file.write_text("name: x\ntokens: {read: [abc]}\nstate_dir: s\n")
        load_device_config(file)
    with pytest.raises(DeviceConfigError, match=r"field 'gpu' = 1: Extra inputs"):
        file.write_text(f"name: x\ntokens: {{read: [{TOKEN_SHA}]}}\nstate_dir: s\ngpu: 1\n")
        load_device_config(file)
    with pytest.raises(DeviceConfigError, match=r"missing field 'state_dir'"):
        file.write_text(f"name: x\ntokens: {{read: [{TOKEN_SHA}]}}\n")
        load_device_config(file)
    with pytest.raises(DeviceConfigError, match="no such device config"):
        load_device_config(tmp_path / "nope.yaml")
    with pytest.raises(DeviceConfigError, match=r"field 'driver' = 'nope:x': cannot import"):
        load_driver("nope:x")
    assert callable(load_driver("sim_scenes.sim_robot:simulated_rp5"))
    # The generic simulated robot takes its task from driver_args; a wrong one is named.
    generic = "sim_scenes.sim_robot:simulated"
    robot = load_driver(generic, {"task": "touch-single", "seed": 3})(("scene",), 32)
    assert robot.spec.name == "rp5" and robot.variant.name == "touch-single"  # type: ignore[attr-defined]
    with pytest.raises(DeviceConfigError, match=r"field 'driver_args' = \{'task_name': 'x'\}"):
        load_driver(generic, {"task_name": "x"})
    with pytest.raises(SceneError, match="unknown task 'touch-moon'"):
        load_driver(generic, {"task": "touch-moon"})(("scene",), 32)


def test_nothing_to_roll_back_to_or_to_run(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    deployer = Deployer(device_config(tmp_path / "empty", keys[1]))
    with pytest.raises(DeployError, match="no previous version"):
        deployer.rollback()
    with pytest.raises(DeployError, match="no active version"):
        deployer.run_episode("touch the red cube", 5)
    assert deployer.status().active is None and deployer.history() == []


FORBIDDEN_ON_DEVICE = {"torch", "ray", "prefect", "mlflow", "stages", "pipelines", "transformers"}


def test_the_agent_runs_a_deployment_without_the_training_stack(
    tmp_path: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    """A fresh agent process (service, deployer, a deploy through every step, an episode)
    loads none of torch, Ray, Prefect, MLflow or robo-pipe's stages and pipelines."""
    program = f"""
import json, sys
from pathlib import Path
from deploy_edge.agent.config import DeviceConfig
from deploy_edge.agent.deployer import Deployer
from deploy_edge.agent.service import create_app
config = DeviceConfig(name="light", tokens={{"read": ["{TOKEN_SHA}"]}},
    trusted_keys=[Path("{keys[1]}")],
    state_dir=Path("{tmp_path / "state"}"), gate_steps=5, gate_warmup=1, pace=False,
    health_ticks=3)
deployer = Deployer(config)
create_app(config, deployer)
done = deployer.deploy(Path("{releases(1)}"))
assert done.state == "active", done
deployer.run_episode("touch the red cube", 3)
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}})))
"""
    ran = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    loaded = set(json.loads(ran.stdout.strip().splitlines()[-1]))
    assert {"onnxruntime", "fastapi", "cryptography", "deploy_edge"} <= loaded
    assert not loaded & FORBIDDEN_ON_DEVICE, sorted(loaded & FORBIDDEN_ON_DEVICE)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("drop_signature", "unsigned"),
        ("edit_manifest", "bad-signature"),
        ("bad_signature_bytes", "bad-signature"),
        ("flip_payload_byte", "hash-mismatch"),
        ("add_file", "extra-file"),
        ("remove_file", "missing-file"),
        ("padded", "size-mismatch"),
    ],
)
def test_a_tampered_release_is_refused_and_the_active_version_is_untouched(
    state: Path,
    keys: tuple[Path, Path],
    releases: Callable[..., Path],
    tmp_path: Path,
    edit: str,
    reason: str,
) -> None:
    """The signature matrix on a device running release 1: every tampered release of release
    3 is refused at verify (or while its files are checked), with the reason, and release 1
    stays active with its files intact."""
    from tests.deploy_edge import test_release as tamper

    tampered = tmp_path / "tampered.release"
    shutil.copy(releases(3), tampered)
    tamper._rewrite(tampered, getattr(tamper, f"_{edit}"))
    deployer = Deployer(device_config(state, keys[1]))
    done = deployer.deploy(tampered)
    assert done.state == "refused" and f": {reason}: " in done.reason, done.reason
    assert_only_release_1(deployer, state)


def test_a_release_over_the_devices_cap_is_refused_before_it_is_unpacked(
    state: Path, keys: tuple[Path, Path], releases: Callable[..., Path]
) -> None:
    """``max_release_mb`` bounds what extraction may write: a release over it is refused at
    the extract step and release 1 stays active."""
    half = releases(3).stat().st_size / (1 << 20) / 2
    deployer = Deployer(device_config(state, keys[1], max_release_mb=half))
    done = deployer.deploy(releases(3))
    assert done.state == "refused" and ": too-large: " in done.reason, done.reason
    assert_only_release_1(deployer, state)


def test_a_rotated_key_stops_releases_of_the_old_one(
    state: Path,
    releases: Callable[..., Path],
    export_dir: Path,
    tmp_path: Path,
) -> None:
    """After rotation the device trusts only the new key: the old key's release is refused,
    one signed by the new key goes live."""
    new_key, new_pub = generate_keypair(tmp_path / "new", "new")
    deployer = Deployer(device_config(state, new_pub))
    old = deployer.deploy(releases(2))
    assert old.state == "refused" and "untrusted-key" in old.reason
    assert_only_release_1(deployer, state)
    fresh = tmp_path / "new.release"
    write_release(
        export_dir,
        fresh,
        load_private_key(new_key),
        model_name="tiny",
        model_version="2",
        run_id="run-2",
        release=2,
    )
    assert deployer.deploy(fresh).state == "active"


# -- precision: auto, pinned variants, systems tests ----------------------------------------------


@pytest.fixture(scope="module")
def variant_release(
    tmp_path_factory: pytest.TempPathFactory, export_dir: Path, keys: tuple[Path, Path]
) -> Callable[..., Path]:
    """``make(release, bundle_edit)``: a signed release of the tiny export with an INT8 variant
    (ONNX Runtime's static Q/DQ quantisation, 2% of the action std) and a non-candidate
    (``int8-wide``, past its error bar); ``random_weights`` marks its spec so."""
    from tests.deploy_edge.variants import with_variants

    root = tmp_path_factory.mktemp("variant-releases")
    bundle = with_variants(
        export_dir,
        root / "bundle",
        {"name": "int8", "relative_error": 0.02},
        {"name": "int8-wide", "file": "copy", "relative_error": 0.09, "candidate": False,
         "reason": "relative error 9.00% > 5.00%"},
    )  # fmt: skip

    def make(release: int, random_weights: bool = False, budget_ms: float | None = None) -> Path:
        source = bundle
        if random_weights:
            import dataclasses

            from deploy_edge.bundle.files import write_bundle_checksums
            from deploy_edge.bundle.io_spec import read_io_spec, write_io_spec

            source = root / f"random-{release}"
            shutil.copytree(bundle, source)
            spec = dataclasses.replace(read_io_spec(source), random_weights=True)
            write_io_spec(source, spec)
            write_bundle_checksums(source)
        out = root / f"{release}-{random_weights}-{budget_ms}.release"
        write_release(
            source,
            out,
            load_private_key(keys[0]),
            model_name="tiny",
            model_version=str(release),
            run_id="run-v",
            release=release,
            budget_ms=budget_ms,
        )
        return out

    return make


def test_precision_auto_activates_the_most_accurate_variant_within_the_budget(
    state: Path,
    keys: tuple[Path, Path],
    variant_release: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FP32 measured over the budget (its p99 raised here: this machine runs both in time), so
    the INT8 variant runs: recorded on the deployment, the slot, and what episodes run."""
    from deploy_edge.agent import trials as module

    real = module.gate_trial

    def slow_fp32(trial: Any, report: Any) -> None:
        real(trial, report)
        if trial.variant == "fp32":
            trial.p99_ms = 500.0

    monkeypatch.setattr(module, "gate_trial", slow_fp32)
    deployer = Deployer(device_config(state, keys[1], target="local-cpu-auto"))
    done = deployer.deploy(variant_release(2))
    assert done.state == "active", done.reason
    assert done.variant == "int8" and done.choice.startswith("int8: the most accurate candidate")
    trials = {t.variant: t for t in done.trials}
    assert list(trials) == ["fp32", "int8", "int8-wide"]
    assert trials["int8"].chosen and trials["int8"].p99_ms is not None
    assert trials["fp32"].failure == "p99 500.00 ms > budget 100 ms" and not trials["fp32"].chosen
    assert not trials["int8-wide"].candidate and trials["int8-wide"].p99_ms is None
    assert trials["int8-wide"].failure.startswith("not a candidate: relative error 9.00%")
    assert (
        "fp32: max |error|" in done.steps[3].detail and "int8: max |error|" in done.steps[3].detail
    )
    assert done.steps[4].detail.startswith("int8: the most accurate candidate within 100 ms")
    status = deployer.status()
    assert status.active is not None and status.active.variant == "int8"
    assert deployer.history()[0].variant == "int8"
    assert deployer.active.policy(status.active).engine.precision == "int8", "episodes run int8"
    assert deployer.run_episode("touch the red cube", 3).errors == 0


def test_precision_auto_with_nothing_in_budget_is_refused_naming_each_p99(
    state: Path, keys: tuple[Path, Path], variant_release: Callable[..., Path]
) -> None:
    deployer = Deployer(device_config(state, keys[1], target="local-cpu-auto"))
    done = deployer.deploy(variant_release(2, budget_ms=0.0001))
    assert done.state == "refused" and done.variant == ""
    assert done.reason.startswith("gate: no candidate meets the budget 0.0001 ms (fp32: p99 ")
    assert "; int8: p99 " in done.reason and "int8-wide: not a candidate" in done.reason
    assert [t.chosen for t in done.trials] == [False, False, False]
    assert done.gate is not None and done.gate.budget_ms == 0.0001, "the fp32 figures"
    assert_only_release_1(deployer, state)


def test_a_pinned_int8_profile_runs_the_int8_variant(
    state: Path, tmp_path: Path, keys: tuple[Path, Path], variant_release: Callable[..., Path]
) -> None:
    profile = tmp_path / "cpu-int8.yaml"
    profile.write_text("name: cpu-int8\nengine: onnxruntime\nprecision: int8\n")
    deployer = Deployer(device_config(state, keys[1], target=str(profile)))
    done = deployer.deploy(variant_release(2))
    assert done.state == "active", done.reason
    assert done.variant == "int8" and done.trials == [] and done.choice == ""
    assert done.steps[2].detail.endswith("(int8, int8)")
    status = deployer.status()
    assert status.active is not None and status.active.variant == "int8"


def test_a_random_weights_release_goes_live_only_as_a_systems_test(
    state: Path, keys: tuple[Path, Path], variant_release: Callable[..., Path]
) -> None:
    deployer = Deployer(device_config(state, keys[1]))
    release = variant_release(2, random_weights=True)
    refused = deployer.deploy(release)
    assert refused.state == "refused" and not refused.systems_test
    assert refused.reason.startswith("verify: random-weights: ")
    assert "--systems-test" in refused.reason
    assert_only_release_1(deployer, state)
    done = deployer.deploy(release, systems_test=True)
    assert done.state == "active" and done.systems_test, done.reason
    assert done.steps[0].detail.endswith("; a systems test")
    status = deployer.status()
    assert status.active is not None and status.active.systems_test
    assert status.active.variant == "fp32", "local-cpu pins fp32"
    assert [d.systems_test for d in deployer.history()[:2]] == [True, False]


def test_an_unscored_options_error_is_measured_on_the_reference_inputs(export_dir: Path) -> None:
    """TensorRT's FP16 build has no export-time score: its error relative to each action
    dimension's std is measured at parity (the worst dimension's mean |error| / its std)."""
    from deploy_edge.agent.trials import _relative_error

    reference = dict(np.load(export_dir / "reference.npz"))
    actions = reference["expected_actions"].copy()
    actions[..., 2] += 0.05  # the normaliser's action std is 1 for the tiny policy
    assert _relative_error(actions, reference, export_dir) == pytest.approx(0.05, rel=1e-5)
    assert _relative_error(None, reference, export_dir) is None
    assert _relative_error(actions, reference, export_dir / "nowhere") is None


@pytest.mark.parametrize(
    ("mode", "gated_on", "gated_ms", "here_ms", "refused"),
    [
        ("sync", "slow", 352.3, 753.0, "8 ticks"),  # 8 ticks here against 4 gated
        ("sync", "slow", 352.3, 399.0, ""),  # a hiccup inside the same 4 ticks
        ("sync", "slow", 352.3, 401.0, "5 ticks"),  # sync counts no margin: 5 ticks
        ("sync", "slow", 80.0, 95.0, ""),  # gated within its period (no delay), still within
        ("sync", "slow", 80.0, 120.0, "2 ticks"),  # past its period here: it would hold
        ("async", "slow", 352.3, 375.0, ""),  # 375 + 20 ms of margin: 4 ticks, as gated
        ("async", "slow", 352.3, 381.0, "5 ticks"),  # 381 + 20 ms of margin = 5 ticks
        ("sync", "local-cpu", 0.7, 753.0, ""),  # gated on another profile: nothing to compare
        ("sync", None, None, 753.0, ""),  # a release from before the figure was recorded
    ],
)
def test_a_device_refuses_a_release_whose_delay_here_is_more_ticks_than_it_was_gated_at(
    mode: Literal["sync", "async"],
    gated_on: str | None,
    gated_ms: float | None,
    here_ms: float,
    refused: str,
) -> None:
    """The device counts ticks by the rule the gate played (``TargetProfile.delay_ticks``):
    async with the profile's margin, sync without one and none within the period."""
    from types import SimpleNamespace

    from deploy_edge.agent.trials import Refused, check_gated_inference
    from deploy_edge.targets import TargetProfile

    profile = TargetProfile(
        name="slow", mode=mode, inference_margin_ms=20.0, action_age_budget_ms=1000.0
    )
    manifest = SimpleNamespace(gated_target=gated_on, gated_inference_ms=gated_ms)
    report = SimpleNamespace(inference_ms=here_ms, control_hz=10.0)
    if not refused:
        check_gated_inference(manifest, profile, report)  # type: ignore[arg-type]
        return
    with pytest.raises(Refused) as said:
        check_gated_inference(manifest, profile, report)  # type: ignore[arg-type]
    assert f"inference p99 {here_ms:.1f} ms on this device, {refused} of 100 ms" in str(said.value)
    gated = profile.delay_ticks(gated_ms or 0.0, 100.0)
    assert f"gated on slow at {gated_ms:.1f} ms ({gated} ticks)" in str(said.value)
