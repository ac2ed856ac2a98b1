"""The edge agent's deployer: a signed release in, a verified, gated, healthy active version out.

    verify    signature by a trusted key; not below the floor (the highest release of the
              model ever installed: :mod:`deploy_edge.agent.floor`), not expired (unless
              forced); the target; a random-weights policy only in a deploy that says it
              is a systems test
    extract   into state_dir/slots/<release>-<sha12> (every file hashed against the manifest)
    engine    the target profile's engine on the new bundle (its pinned precision's model or
              variant; ``precision: auto``: one engine per way to run it, see below)
    parity    the engine on the bundle's reference inputs reproduces the expected outputs
              (a variant: within its recorded ``reference_error`` plus a margin; an option
              the export did not score, TensorRT's FP16 build, has its error relative to the
              action std measured here on those inputs, so that the choice can rank it)
    gate      the latency gate on the device's robot (the release's budget, else the profile's)
    ---       if the robot-busy lock file exists: stop here, "staged" (activate_staged() later)
    activate  flip state_dir/active to the new slot (atomic symlink rename); previous = old
    health    a few control ticks of the active version: no deadline miss, no engine error
    commit    the floor raised to this release; the journal's end record: from here on the
              new version stays

The engine, parity and gate steps are :mod:`deploy_edge.agent.trials`. With ``precision: auto``
they run for every candidate the profile's engine can run (:func:`deploy_edge.latency.options`);
one that fails to build or misses its parity is out, with its reason, and the others go on;
the gate step then activates the most accurate one that meets the budget
(:func:`deploy_edge.latency.choose_variant`) and is refused only when none does (the reason
names each one's p99 against the budget). The
deployment record's ``variant``, ``trials`` and ``choice`` say which runs and why the others do
not; the slot's ``variant`` is what the health check and episodes run.

Any failing step rolls back: the links return to what they were and the new slot is deleted;
the deployment is "refused" (failed before activate) or "rolled_back" (after). Every step is
journaled (``state_dir/journal.jsonl``, fsynced) before and after it runs; :meth:`recover` at
start undoes a deployment that was cut off (``kill -9``, power loss) before its commit, so the
device always runs a complete old or new version. Only the active and previous slots (and a
staged one) are kept.

State directory::

    active, previous, staged           symlinks to slots/<name>/<bundle>
    slots/<name>/, slots/<name>.json   an extracted release and its :class:`Slot` record
    journal.jsonl, history.jsonl       the journal; every finished deployment, oldest first
    floor.json                         the release floor, per model

The records it answers with (:class:`Deployment`, :class:`DeviceStatus`, ...) are the wire
records of :mod:`deploy_edge.wire`, which the deploy client reads back.

Fault injection: with ``ROBO_PIPE_AGENT_CRASH_AT=<step>`` in the environment the process kills
itself (SIGKILL) right after journaling that step's start.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.agent import trials
from deploy_edge.agent.config import DeviceConfig, DeviceConfigError, load_driver
from deploy_edge.agent.floor import ReleaseFloor
from deploy_edge.agent.journal import (
    Journal,
    flip_link,
    read_json_lines,
    remove_link,
    write_atomic,
)
from deploy_edge.agent.trials import Refused
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.exported import ExportedPolicy
from deploy_edge.keys import load_public_key
from deploy_edge.latency import (
    Option,
    load_target,
    open_policy,
    pinned_option,
    target_loop,
)
from deploy_edge.release.header import ReleaseError
from deploy_edge.release.manifest import Manifest, check_policy, has_expired
from deploy_edge.release.payload import extract_release
from deploy_edge.release.signature import verify_release
from deploy_edge.runtime import Tick
from deploy_edge.wire import (
    Deployment,
    DeviceStatus,
    EpisodeResult,
    Origin,
    Slot,
    StepResult,
)
from robo_pipe.errors import InputError, RoboPipeError
from robo_pipe.integrity import file_sha256
from robo_pipe.records import RecordError
from robots.interface import Robot, RobotObservation

CRASH_ENV = "ROBO_PIPE_AGENT_CRASH_AT"
"""Fault injection: the step at whose start the process SIGKILLs itself."""
LINKS = ("active", "previous", "staged")

log = logging.getLogger("deploy_edge.agent")


class DeployError(RoboPipeError, RuntimeError):
    """The agent cannot do this now: a deployment is running, nothing to roll back to, no
    active version to run."""


class _StepFailed(Exception):
    """A step failed: the deployment is undone."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step, self.detail = step, detail


class _Run:
    """A deployment under way: its record, journaled step by step."""

    def __init__(
        self,
        journal: Journal,
        deployment: Deployment,
        release_file: Path | None,
        on_step: Callable[[Deployment], None] | None,
        publish: Callable[[Deployment | None], None],
    ) -> None:
        self.journal, self.deployment = journal, deployment
        self.release_file, self.on_step, self.publish = release_file, on_step, publish
        self.slot: Slot | None = None
        self.before: dict[str, str | None] | None = None
        """The links before this run first changed them (what a rollback restores)."""
        self.detail = ""

    @property
    def id(self) -> str:
        return self.deployment.id

    def begin(self) -> None:
        event = {"event": "begin", "id": self.id, "deployment": self.deployment.to_json()}
        self.journal.append(event)
        self.publish(copy.deepcopy(self.deployment))

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Journal the start, run the body, record and journal the result; a failing body
        raises :class:`_StepFailed`."""
        self.journal.append({"event": "step", "id": self.id, "step": name, "phase": "start"})
        if os.environ.get(CRASH_ENV) == name:
            os.kill(os.getpid(), signal.SIGKILL)
        self.detail, start, failure = "", time.perf_counter(), None
        try:
            yield
        except Refused as err:
            failure = str(err)
        except ReleaseError as err:
            failure = f"{err.reason}: {err}"
        except Exception as err:  # any fault of the new version refuses it, never crashes us
            failure = f"{type(err).__name__}: {err}"
        result = StepResult(name, failure is None, time.perf_counter() - start, "")
        result.detail = self.detail if failure is None else failure
        self.deployment.steps.append(result)
        self.journal.append(
            {
                "event": "step",
                "id": self.id,
                "step": name,
                "phase": "end",
                "result": result.to_json(),
            }
        )
        self.publish(copy.deepcopy(self.deployment))
        if self.on_step is not None:
            self.on_step(copy.deepcopy(self.deployment))
        if failure is not None:
            raise _StepFailed(name, failure)

    def started(self, name: str) -> bool:
        return self.deployment.step(name) is not None


class ShadowRobot(Robot):
    """A robot whose actions are computed but never sent: it observes through ``robot`` and
    keeps the last action (the health check's shadow mode on a real arm)."""

    def __init__(self, robot: Robot) -> None:
        self.robot, self.spec = robot, robot.spec
        self.last_action: np.ndarray | None = None

    def connect(self) -> None:
        self.robot.connect()

    def observe(self) -> RobotObservation:
        return self.robot.observe()

    def act(self, action: np.ndarray) -> None:
        self.last_action = np.asarray(action)  # held, not sent

    def stop(self) -> None:
        self.robot.stop()

    @property
    def is_connected(self) -> bool:
        return self.robot.is_connected


class Deployer:
    """Deploys releases on this device (see the module docstring). Thread-safe: deployments,
    activations, rollbacks and episodes run one at a time; :meth:`status` and :meth:`history`
    answer at any time."""

    def __init__(self, config: DeviceConfig) -> None:
        self.config = config
        self.profile = load_target(config.target)
        self.driver = load_driver(config.driver)
        self.state_dir = Path(config.state_dir).absolute()
        self.slots_dir = self.state_dir / "slots"
        state_dir_existed = self.state_dir.is_dir()
        try:
            self.slots_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(self.state_dir, os.R_OK | os.W_OK | os.X_OK):
                raise PermissionError("not readable and writable by this user")
        except OSError as err:  # a state it cannot see: never start as if it were fresh
            raise DeviceConfigError(
                f"field 'state_dir' = '{self.state_dir}': cannot hold the agent's state "
                f"({type(err).__name__}: {err})"
            ) from err
        self.journal = Journal(self.state_dir / "journal.jsonl")
        self.history_file = self.state_dir / "history.jsonl"
        self.floor = ReleaseFloor(self.state_dir)
        self._floor_notice = self.floor.load(state_dir_existed, self._installed())
        """Why the floor may be lower than it should be ("": it is whole); until the next
        install rewrites it."""
        if self._floor_notice:
            log.warning("%s", self._floor_notice)
        self._lock = threading.RLock()  # the robot and the links: one user at a time
        self._deploying = threading.Lock()
        self._running: Deployment | None = None
        self._recovered = False
        self._serving: tuple[str, ExportedPolicy, str] | None = None
        """The policy server's engine: (active bundle path, policy, version), opened once per
        active version."""
        self._serving_lock = threading.Lock()

    # -- the deployment ------------------------------------------------------------------------

    def deploy(
        self,
        release_file: Path,
        force: bool = False,
        on_step: Callable[[Deployment], None] | None = None,
        systems_test: bool = False,
        origin: Origin | None = None,
    ) -> Deployment:
        """Deploy ``release_file`` through every step (see the module docstring); returns the
        finished record ("active", "staged", "refused" or "rolled_back"). ``systems_test``: the
        deploy says it is a systems test, so a random-weights release may go live (recorded on
        the deployment and the slot); ``origin``: who asked (recorded on the deployment)."""
        if not self._deploying.acquire(blocking=False):
            raise DeployError("a deployment is running; wait for it to finish")
        try:
            with self._lock:
                self._recover_once()
                run = self._start(Path(release_file), on_step)
                run.deployment.systems_test = systems_test
                run.deployment.origin = origin
                try:
                    with run.step("verify"):
                        manifest = self._verify(run, force)
                    with run.step("extract"):
                        slot = self._extract(run, manifest)
                    with run.step("engine"):
                        engines, run.detail = trials.build(run.deployment, slot, self.profile)
                    with run.step("parity"):
                        engines, run.detail = trials.parity(
                            run.deployment, engines, slot, self.profile
                        )
                    with run.step("gate"):
                        self._gate(run, engines, slot, manifest)
                    if self.locked():
                        return self._stage(run, slot)
                    return self._go_live(run, slot)
                except _StepFailed as failure:
                    return self._undo(run, failure)
        finally:
            self._running = None
            self._deploying.release()

    def _go_live(self, run: _Run, slot: Slot) -> Deployment:
        """Activate, health check, commit (a failure propagates to the caller's undo)."""
        with run.step("activate"):
            self._switch(run, active=slot.path, previous=self._target("active"), staged=None)
            run.detail = f"active -> {os.path.relpath(slot.path, self.state_dir)}"
        with run.step("health"):
            self._health(run)
        with run.step("commit"):
            # Before the end record: a crash in between leaves the floor high, never low.
            self.floor.raise_to(slot.model_name, slot.release)
            self._floor_notice = ""
            run.detail = f"journaled; floor of {slot.model_name}: {self.floor.of(slot.model_name)}"
        return self._finish(run, "active")

    def activate_staged(self, origin: Origin | None = None) -> Deployment | None:
        """Activate the staged version (activate, health, commit) once the robot-busy lock is
        gone; None when nothing is staged or the lock is still set. ``origin``: who asked (the
        lock watcher: None, the staged deployment's own origin stays)."""
        with self._lock:
            self._recover_once()
            slot = self._slot("staged")
            if slot is None or self.locked():
                return None
            staged = self._last_record(slot.sha256, "staged")
            deployment = staged or Deployment(
                _new_id(), slot.sha256, slot.model_name, slot.model_version, slot.release, ""
            )
            deployment.state, deployment.reason, deployment.finished_at = "running", "", None
            deployment.origin = origin or deployment.origin
            run = _Run(self.journal, deployment, None, None, self._publish)
            run.slot = slot
            run.begin()
            self._snapshot(run)  # interrupted from here on: the staged slot is dropped too
            try:
                return self._go_live(run, slot)
            except _StepFailed as failure:
                return self._undo(run, failure)
            finally:
                self._running = None

    def rollback(self, release: int | None = None, origin: Origin | None = None) -> Deployment:
        """Back to the previous version, which becomes active; recorded as a deployment in
        state "rolled_back" with ``origin`` (who asked: a person, a fleet's revert).

        The rollback target rule: after a rollback, ``previous`` is never the version rolled
        back from (replaced, or refused by a fleet: a second rollback would re-activate it).
        It would be the version that ran before the restored one, but the device keeps only
        the active, previous and staged slots, so that one is gone: ``previous`` is none, and
        the version rolled back from is deleted. Going back further is a deploy.

        ``release``: roll back only if the previous version is that release; a
        :class:`DeployError` naming what the device holds otherwise (as when there is no
        previous version)."""
        with self._lock:
            self._recover_once()
            active, previous = self._slot("active"), self._slot("previous")
            holds = f"active: {_label(active) if active else 'none'}, previous: " + (
                _label(previous) if previous else "none"
            )
            if previous is None or active is None:
                raise DeployError(f"no previous version on this device to roll back to ({holds})")
            if release is not None and previous.release != release:
                raise DeployError(
                    f"release {release} is not the previous version on this device ({holds})"
                )
            deployment = Deployment(
                _new_id(),
                previous.sha256,
                previous.model_name,
                previous.model_version,
                previous.release,
                "running",
                started_at=_now(),
                origin=origin,
            )
            run = _Run(self.journal, deployment, None, None, self._publish)
            run.begin()
            try:
                with run.step("activate"):
                    self._switch(run, active=previous.path, previous=None)
                    run.detail = f"active -> {_label(previous)} (was {_label(active)}); no previous"
                with run.step("commit"):
                    run.detail = "journaled"
            except _StepFailed as failure:
                return self._undo(run, failure)
            finally:
                self._running = None
            reason = f"rollback from {_label(active)} to {_label(previous)}{_asked_by(origin)}"
            return self._finish(run, "rolled_back", reason)

    def unstage(self, origin: Origin | None = None) -> Deployment:
        """Drop the staged version: its link removed, its slot deleted, never activated; its
        deployment record becomes "unstaged" (``origin``: who asked). A :class:`DeployError`
        when nothing is staged."""
        with self._lock:
            self._recover_once()
            slot = self._slot("staged")
            if slot is None:
                raise DeployError("nothing staged on this device")
            deployment = self._last_record(slot.sha256, "staged") or Deployment(
                _new_id(), slot.sha256, slot.model_name, slot.model_version, slot.release, ""
            )
            deployment.state, deployment.finished_at = "running", None
            deployment.origin = origin or deployment.origin
            run = _Run(self.journal, deployment, None, None, self._publish)
            run.slot = slot
            run.begin()
            self._switch(run, staged=None)  # journaled first: a crash restores the link
            reason = f"unstaged before it was activated{_asked_by(origin)}"
            return self._finish(run, "unstaged", reason)

    # -- the steps -----------------------------------------------------------------------------

    def _verify(self, run: _Run, force: bool) -> Manifest:
        assert run.release_file is not None
        keys = [load_public_key(path) for path in self.config.trusted_keys]
        manifest = verify_release(run.release_file, keys)
        d = run.deployment
        d.model_name, d.model_version, d.release = (
            manifest.model_name,
            manifest.model_version,
            manifest.release,
        )
        active = self._slot("active")
        if active is not None and active.sha256 == d.release_sha256:
            raise Refused(f"release {d.release_sha256[:12]} is already the active version")
        if manifest.targets and self.profile.name not in manifest.targets:
            raise Refused(
                f"release is for targets {manifest.targets}, this device is {self.profile.name!r}"
            )
        if manifest.io_spec.random_weights and not d.systems_test:
            raise Refused(
                "random-weights: the policy was built with random weights for systems "
                "measurements only; deploy it only as a systems test (robo-pipe deploy "
                "--systems-test)"
            )
        floor = self.floor.of(manifest.model_name)
        d.forced = check_policy(manifest, floor=floor, force=force)
        past = [f"{r} (floor {floor})" if r == "downgrade" else r for r in d.forced]
        forced = f"; forced past: {', '.join(past)}" if d.forced else ""
        test = "; a systems test" if d.systems_test else ""
        run.detail = (
            f"{manifest.model_name} {manifest.model_version} release {manifest.release}, "
            f"signed by {manifest.key_id}{forced}{test}"
        )
        return manifest

    def _extract(self, run: _Run, manifest: Manifest) -> Slot:
        assert run.release_file is not None
        sha = run.deployment.release_sha256
        name = f"{manifest.release}-{sha[:12]}"
        if name in self._referenced_slots():  # e.g. the previous version, redeployed by force
            name = f"{name}-{run.id[:6]}"
        dest = self.slots_dir / name
        _remove(dest)  # a leftover of an interrupted deployment
        cap = int(self.config.max_release_mb * (1 << 20))  # MiB -> bytes
        bundle = extract_release(run.release_file, manifest, dest, max_bytes=cap)
        slot = Slot(manifest.model_name, manifest.model_version, manifest.release, str(bundle), sha)
        slot.systems_test = run.deployment.systems_test
        slot.expires_at = manifest.expires_at
        write_atomic(self.slots_dir / f"{name}.json", _dumps(slot.to_json()))
        run.slot = slot
        run.detail = f"{len(manifest.files)} files into slots/{name}"
        return slot

    def _gate(
        self, run: _Run, engines: list[trials.Candidate], slot: Slot, manifest: Manifest
    ) -> None:
        """The latency gate (:func:`deploy_edge.agent.trials.gate`); the slot records what
        runs."""
        run.detail = trials.gate(
            run.deployment,
            engines,
            slot,
            manifest.budget_ms,
            self.profile,
            self.config,
            self.driver,
        )
        slot.variant = run.deployment.variant
        write_atomic(self.slots_dir / f"{self._slot_name(slot.path)}.json", _dumps(slot.to_json()))

    def _health(self, run: _Run) -> None:
        shadow = self.config.shadow_health
        ticks, _ = self._control(self.config.instruction, self.config.health_ticks, shadow=shadow)
        misses = sum(t.missed for t in ticks)
        errors = [t.error for t in ticks if t.error]
        if misses or errors:
            first = f" (first: {errors[0]})" if errors else ""
            raise Refused(
                f"{misses} deadline misses, {len(errors)} engine errors in {len(ticks)} "
                f"ticks{first}"
            )
        worst = max(t.latency_s for t in ticks) * 1000.0
        run.detail = f"{len(ticks)} ticks, no miss, no error (max {worst:.2f} ms)"

    def _control(
        self,
        instruction: str | None,
        max_ticks: int,
        until_done: bool = False,
        shadow: bool = False,
    ) -> tuple[list[Tick], Robot]:
        """Up to ``max_ticks`` control ticks of the active version on a fresh robot (until the
        robot reports its episode done, with ``until_done``); with ``shadow`` the actions are
        computed but not sent."""
        active = self._slot("active")
        policy = self._run_policy(active)
        p = self.profile
        robot: Robot = self.driver(policy.cameras, policy.image_size)
        if shadow:
            robot = ShadowRobot(robot)
        robot.connect()
        if not instruction:  # the scene's own task, when the driver poses one
            instruction = getattr(robot, "instruction", None) or self.config.instruction
        ticks: list[Tick] = []
        try:
            with target_loop(policy, robot, instruction, p, self.config.pace) as loop:
                while len(ticks) < max_ticks and not (until_done and getattr(robot, "done", False)):
                    ticks += loop.run(1)
        finally:
            robot.stop()
        return ticks, robot

    def _run_policy(self, slot: Slot | None) -> ExportedPolicy:
        """The active version as its slot says it runs: the variant its deployment pinned or
        chose (a slot recorded before variants: as the profile pins it; FP32 under auto)."""
        p = self.profile
        root = self.state_dir / "active"
        spec = read_io_spec(root)
        name = slot.variant if slot is not None else ""
        variant = spec.variant(name) if name else None
        if variant is not None:
            option = Option(name, variant.precision, name)
        elif name:  # the FP32 model, in FP32 or (TensorRT) FP16
            option = Option(name, name, None)
        elif p.precision == "auto":
            option = Option("fp32", "fp32", None)
        else:
            option = pinned_option(spec, p)
        return open_policy(root, p, option)

    # -- links, staging, rollback, the end of a run --------------------------------------------

    def _switch(self, run: _Run, **links: str | None) -> None:
        """Point the named links (``active``, ``previous``, ``staged``) at bundle paths (None:
        remove), after journaling what they were (the first time in this run)."""
        self._snapshot(run)
        self._set_links(links)

    def _snapshot(self, run: _Run) -> None:
        """Journal the links as they are, once per run: what an undo or a recovery restores."""
        if run.before is None:
            run.before = self._links()
            slot = run.slot.path if run.slot else None
            self.journal.append(
                {"event": "links", "id": run.id, "before": run.before, "slot": slot}
            )

    def _set_links(self, links: dict[str, str | None]) -> None:
        for name, target in links.items():
            link = self.state_dir / name
            if target is None:
                remove_link(link)
            else:
                flip_link(link, os.path.relpath(target, self.state_dir))

    def _restore(self, before: dict[str, str | None] | None, slot: str | None) -> list[str]:
        """Put the links back as ``before`` (a staged link to ``slot`` is dropped); returns what
        changed."""
        if before is None:
            return []
        wanted = {k: (None if k == "staged" and v == slot else v) for k, v in before.items()}
        now = self._links()
        changed = [k for k in LINKS if now.get(k) != wanted.get(k)]
        self._set_links({k: wanted.get(k) for k in changed})
        return changed

    def _stage(self, run: _Run, slot: Slot) -> Deployment:
        self._switch(run, staged=slot.path)
        lock = self.config.lock_file
        return self._finish(run, "staged", f"robot busy ({lock} exists): activation deferred")

    def _undo(self, run: _Run, failure: _StepFailed) -> Deployment:
        self._restore(run.before, run.slot.path if run.slot else None)
        state = "rolled_back" if run.started("activate") else "refused"
        return self._finish(run, state, str(failure))

    def _finish(self, run: _Run, state: str, reason: str = "") -> Deployment:
        """The end record (the commit point for "active"), the history, old slots removed."""
        d = run.deployment
        d.state, d.reason, d.finished_at = state, reason, _now()
        self.journal.append({"event": "end", "id": d.id, "deployment": d.to_json()})
        self._append_history(d)
        self._supersede_staged(run)
        self._collect_garbage()
        self._running = None
        if run.on_step is not None:
            run.on_step(copy.deepcopy(d))
        return d

    def _supersede_staged(self, run: _Run) -> None:
        """Record a staged version that ``run`` replaced (or activated past) as refused."""
        dropped = (run.before or {}).get("staged")
        if dropped is None or dropped == self._target("staged"):
            return
        if run.slot is not None and dropped == run.slot.path:
            return
        name = self._slot_name(dropped)
        slot = self._read_slot(name) if name else None
        old = self._last_record(slot.sha256, "staged") if slot else None
        if old is not None:
            old.state, old.finished_at = "refused", _now()
            old.reason = f"superseded by deployment {run.id} before it was activated"
            self._append_history(old)

    def _start(self, release_file: Path, on_step: Callable[[Deployment], None] | None) -> _Run:
        sha = file_sha256(release_file) if release_file.is_file() else ""
        deployment = Deployment(_new_id(), sha, "", "", 0, "running", started_at=_now())
        run = _Run(self.journal, deployment, release_file, on_step, self._publish)
        run.begin()
        return run

    def _publish(self, deployment: Deployment | None) -> None:
        self._running = deployment

    # -- recovery ------------------------------------------------------------------------------

    def recover(self) -> list[str]:
        """Undo a deployment the journal shows was cut off before its commit (links back as
        they were, its slot deleted, recorded as "interrupted"); remove every slot no link
        points to. Call once at start, before serving. Returns what was done, one note each."""
        with self._lock:
            notes: list[str] = []
            cut_off: dict[str, dict[str, Any]] = {}
            finished: dict[str, dict[str, Any]] = {}
            for event in self.journal.read():
                kind, run_id = event.get("event"), str(event.get("id"))
                if kind == "begin":
                    cut_off[run_id] = {"deployment": event["deployment"], "step": "", "links": None}
                elif kind == "end":
                    cut_off.pop(run_id, None)
                    finished[run_id] = event["deployment"]
                elif run_id not in cut_off:
                    continue
                elif kind == "links" and cut_off[run_id]["links"] is None:
                    cut_off[run_id]["links"] = event
                elif kind == "step" and event.get("phase") == "start":
                    cut_off[run_id]["step"] = event["step"]
                elif kind == "step" and event.get("phase") == "end":
                    cut_off[run_id]["deployment"]["steps"].append(event["result"])
            notes += self._repair_history(finished)
            for run_id, info in cut_off.items():
                notes.append(self._recover_one(run_id, info))
            notes += self._collect_garbage()
            self._recovered = True
            return notes

    def _recover_once(self) -> None:
        """Recover first if :meth:`recover` was not called: an open deployment in the journal
        must be undone before another changes the links."""
        if not self._recovered:
            self.recover()

    def _recover_one(self, run_id: str, info: dict[str, Any]) -> str:
        try:
            deployment = Deployment.from_json(info["deployment"])
        except RecordError:
            deployment = Deployment(run_id, "", "", "", 0, "running")
        links = info["links"] or {}
        changed = self._restore(links.get("before"), links.get("slot"))
        undone = f"links restored: {', '.join(changed)}" if changed else "no link had changed"
        deployment.state, deployment.finished_at = "interrupted", _now()
        where = f"step '{info['step']}'" if info["step"] else "its start"
        deployment.reason = f"{where}: the agent stopped before the commit; {undone}"
        self.journal.append({"event": "end", "id": run_id, "deployment": deployment.to_json()})
        self._append_history(deployment)
        return f"deployment {run_id} ({_label(deployment)}) interrupted at {where}; {undone}"

    def _repair_history(self, finished: dict[str, dict[str, Any]]) -> list[str]:
        """Append the end records the history lacks (a crash between the two writes)."""
        last = {r.get("id"): r for r in read_json_lines(self.history_file)}
        notes = []
        for run_id, record in finished.items():
            if last.get(run_id) != record:
                with self.history_file.open("a", encoding="utf-8") as f:
                    f.write(_dumps(record))
                notes.append(f"deployment {run_id}: history record restored from the journal")
        return notes

    def _collect_garbage(self) -> list[str]:
        """Remove dangling links, temporary files and every slot no link points to."""
        notes = []
        for name in LINKS:
            link = self.state_dir / name
            if link.is_symlink() and not link.exists():
                remove_link(link)
                notes.append(f"removed the dangling link {name}")
        for tmp in self.state_dir.glob(".*.tmp"):
            _remove(tmp)
        keep = self._referenced_slots()
        for entry in sorted(self.slots_dir.iterdir()):
            if entry.name.removesuffix(".json") not in keep:
                _remove(entry)
                if entry.suffix != ".json":
                    notes.append(f"removed slots/{entry.name} (not active, previous or staged)")
        return notes

    # -- what the device runs ------------------------------------------------------------------

    def status(self) -> DeviceStatus:
        """Active, previous and staged version, the lock, the running and the last deployment,
        the release floor, and what an operator should know (lost state, an expired active
        release)."""
        history = self.history()
        active = self._slot("active")
        notices = [self._floor_notice] if self._floor_notice else []
        if active is not None and has_expired(active.expires_at):  # parsed at install
            # Expiry is an install rule: the robot keeps running what it has.
            notices.append(
                f"the active release {_label(active)} expired at {active.expires_at}; it keeps "
                "running (expiry is checked at install): deploy a newer release"
            )
        return DeviceStatus(
            device=self.config.name,
            target=self.profile.name,
            active=active,
            previous=self._slot("previous"),
            staged=self._slot("staged"),
            locked=self.locked(),
            running=copy.deepcopy(self._running),
            last=history[0] if history else None,
            floor=dict(self.floor.releases),
            notices=notices,
        )

    def history(self) -> list[Deployment]:
        """Every finished deployment, newest first (the latest record of each)."""
        latest: dict[str, Deployment] = {}
        for record in read_json_lines(self.history_file):
            with contextlib.suppress(RecordError):
                deployment = Deployment.from_json(record)
                latest.pop(deployment.id, None)  # re-inserted last: ordered by last update
                latest[deployment.id] = deployment
        return list(reversed(latest.values()))

    def run_episode(self, instruction: str | None, max_ticks: int) -> EpisodeResult:
        """One episode of the active version on the device's robot: until the robot says it is
        done or ``max_ticks``. ``instruction`` None: the task the robot's scene poses (a driver
        that has one, like the simulated rp5), else the config's. Versions switch only between
        episodes."""
        if max_ticks < 1:
            raise InputError(f"max_ticks must be >= 1, got {max_ticks}")
        with self._lock:
            self._recover_once()
            slot = self._slot("active")
            if slot is None:
                raise DeployError("no active version on this device: deploy a release first")
            ticks, robot = self._control(instruction, max_ticks, until_done=True)
        ms = np.array([t.latency_s for t in ticks]) * 1000.0
        success = getattr(robot, "success", None)
        return EpisodeResult(
            version=f"{slot.model_name}:{slot.model_version}",
            success=None if success is None else bool(success),
            ticks=len(ticks),
            p50_ms=float(np.percentile(ms, 50)),
            p99_ms=float(np.percentile(ms, 99)),
            misses=sum(t.missed for t in ticks),
            errors=sum(bool(t.error) for t in ticks),
        )

    def serving_policy(self) -> tuple[ExportedPolicy, str]:
        """The active version's policy as the policy server (``WS /policy``) runs it, and its
        ``model:version``: opened as the health check runs it (:meth:`_run_policy`) the first
        time a version is asked for, then reused until another version is active. Does not wait
        on a deployment (the engine is shared by the server's threads: ONNX Runtime's
        ``run`` is thread-safe); :class:`DeployError` when nothing is active."""
        with self._serving_lock:
            slot = self._slot("active")
            if slot is None:
                raise DeployError("no active version on this device: deploy a release first")
            if self._serving is None or self._serving[0] != slot.path:
                policy = self._run_policy(slot)
                self._serving = (slot.path, policy, f"{slot.model_name}:{slot.model_version}")
            return self._serving[1], self._serving[2]

    def locked(self) -> bool:
        """Whether the robot-busy lock file exists."""
        lock = self.config.lock_file
        return lock is not None and lock.exists()

    # -- helpers -------------------------------------------------------------------------------

    def _target(self, link: str) -> str | None:
        """The absolute bundle path ``state_dir/<link>`` points to (None: no such link)."""
        path = self.state_dir / link
        if not path.is_symlink():
            return None
        return os.path.normpath(self.state_dir / os.readlink(path))

    def _links(self) -> dict[str, str | None]:
        return {name: self._target(name) for name in LINKS}

    def _slot_name(self, bundle: str) -> str | None:
        """The slot directory (under ``slots/``) holding ``bundle``."""
        rel = Path(os.path.relpath(bundle, self.slots_dir))
        return rel.parts[0] if rel.parts and rel.parts[0] not in ("..", ".") else None

    def _referenced_slots(self) -> set[str]:
        names = (self._slot_name(t) for t in self._links().values() if t is not None)
        return {n for n in names if n is not None}

    def _slot(self, link: str) -> Slot | None:
        target = self._target(link)
        name = self._slot_name(target) if target else None
        slot = self._read_slot(name) if name else None
        if slot is not None and target is not None:
            slot.path = target  # where it is now (a state directory may have moved)
        return slot

    def _read_slot(self, name: str) -> Slot | None:
        try:
            return Slot.from_json(json.loads((self.slots_dir / f"{name}.json").read_text()))
        except (OSError, ValueError):  # RecordError and JSONDecodeError are ValueErrors
            return None

    def _installed(self) -> dict[str, int]:
        """Model name -> the highest release the history says went live or a slot on the
        device holds (what a lost floor record is rebuilt from)."""
        releases = [(d.model_name, d.release) for d in self.history() if d.state == "active"]
        for record in self.slots_dir.glob("*.json"):
            slot = self._read_slot(record.stem)
            if slot is not None:
                releases.append((slot.model_name, slot.release))
        installed: dict[str, int] = {}
        for model, release in releases:
            installed[model] = max(release, installed.get(model, release))
        return installed

    def _last_record(self, sha256: str, state: str) -> Deployment | None:
        """The newest deployment of the release ``sha256`` now in ``state``."""
        for deployment in self.history():
            if deployment.release_sha256 == sha256 and deployment.state == state:
                return deployment
        return None

    def _append_history(self, deployment: Deployment) -> None:
        with self.history_file.open("a", encoding="utf-8") as f:
            f.write(_dumps(deployment.to_json()))
            f.flush()
            os.fsync(f.fileno())


def _label(item: Slot | Deployment) -> str:
    return f"{item.label} (release {item.release})"


def _asked_by(origin: Origin | None) -> str:
    """Who asked, for a record's reason: `` (by cli)``, `` (by fleet, rollout R, flow run
    URL)``; "" when the request did not say."""
    if origin is None:
        return ""
    parts = [f"by {origin.by}"]
    parts += [f"rollout {origin.rollout}"] if origin.rollout else []
    parts += [f"flow run {origin.flow_run}"] if origin.flow_run else []
    return f" ({', '.join(parts)})"


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":")) + "\n"


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
