"""The edge agent's deployer: a signed release in, a verified, gated, healthy active version out.

    verify    signature, floor, expiry, target, random weights   (deploy_edge.agent.intake)
    extract   into state_dir/slots/<release>-<sha12>, hashed    (deploy_edge.agent.intake)
    engine    the target profile's engine(s) on the new bundle   (deploy_edge.agent.trials)
    parity    the engine reproduces the bundle's reference outputs  (trials)
    gate      the latency gate on the device's robot              (trials)
    ---       if the robot-busy lock file exists: stop here, "staged" (activate_staged() later)
    activate  flip state_dir/active to the new slot (atomic symlink rename); previous = old
    health    a few control ticks of the active version: no deadline miss, no engine error
              (deploy_edge.agent.active)
    commit    the floor raised to this release; the journal's end record: from here on the
              new version stays

With ``precision: auto`` the trials run every candidate the profile's engine can run and the
gate step activates the most accurate one that meets the budget; the deployment record's
``variant``, ``trials`` and ``choice`` say which runs and why the others do not, and the slot's
``variant`` is what the health check and episodes run.

Any failing step rolls back: the links return to what they were and the new slot is deleted;
the deployment is "refused" (failed before activate) or "rolled_back" (after). Every step is
journaled before and after it runs (:mod:`deploy_edge.agent.journaled_run`); :meth:`recover` at
start undoes a deployment that was cut off (``kill -9``, power loss) before its commit
(:mod:`deploy_edge.agent.recovery`), so the device always runs a complete old or new version.
Only the active and previous slots (and a staged one) are kept.

State directory: ``active``, ``previous``, ``staged`` (links to slots) and ``slots/``
(:mod:`deploy_edge.agent.slots`), ``journal.jsonl``, ``history.jsonl``
(:mod:`deploy_edge.agent.history`), ``floor.json`` (the release floor, per model). The records
it answers with (:class:`Deployment`, :class:`DeviceStatus`, ...) are the wire records of
:mod:`deploy_edge.wire`, which the deploy client reads back.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from deploy_edge.agent import intake, trials
from deploy_edge.agent.active import ActiveVersion, Served
from deploy_edge.agent.config import DeviceConfig, load_driver
from deploy_edge.agent.floor import ReleaseFloor, installed_releases
from deploy_edge.agent.history import History
from deploy_edge.agent.journal import Journal
from deploy_edge.agent.journaled_run import JournaledRun, StepFailed
from deploy_edge.agent.recovery import undo_cut_off
from deploy_edge.agent.slots import SlotStore
from deploy_edge.release.manifest import Manifest, has_expired
from deploy_edge.targets import load_target
from deploy_edge.wire import (
    Deployment,
    DeviceStatus,
    EpisodeResult,
    Origin,
    Slot,
)
from robo_pipe.errors import InputError, RoboPipeError
from robo_pipe.integrity import file_sha256

log = logging.getLogger("deploy_edge.agent")


class DeployError(RoboPipeError, RuntimeError):
    """The agent cannot do this now: a deployment is running, nothing to roll back to, no
    active version to run."""


class Deployer:
    """Deploys releases on this device (see the module docstring). Thread-safe: deployments,
    activations, rollbacks and episodes run one at a time; :meth:`status` and :meth:`history`
    answer at any time."""

    def __init__(self, config: DeviceConfig) -> None:
        self.config = config
        self.profile = load_target(config.target)
        self.driver = load_driver(config.driver, config.driver_args)
        self.state_dir = Path(config.state_dir).absolute()
        state_dir_existed = self.state_dir.is_dir()
        self.slots = SlotStore(self.state_dir)
        self.journal = Journal(self.state_dir / "journal.jsonl")
        self.history_log = History(self.state_dir / "history.jsonl")
        self.floor = ReleaseFloor(self.state_dir)
        self._floor_notice = self.floor.load(
            state_dir_existed, installed_releases(self.history_log, self.slots)
        )
        """Why the floor may be lower than it should be ("": it is whole); until the next
        install rewrites it."""
        if self._floor_notice:
            log.warning("%s", self._floor_notice)
        self._lock = threading.RLock()  # the robot and the links: one user at a time
        self._deploying = threading.Lock()
        self._running: Deployment | None = None
        self._recovered = False
        self.active = ActiveVersion(config, self.profile, self.driver, self.slots)
        """Runs the active version: health checks, episodes, the policy server's engine."""

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
                        manifest = intake.verify(
                            run, self.config, self.profile, self.slots, self.floor, force
                        )
                    with run.step("extract"):
                        cap = self.config.max_release_mb
                        slot = intake.extract(run, manifest, self.slots, cap)
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
                except StepFailed as failure:
                    return self._undo(run, failure)
        finally:
            self._running = None
            self._deploying.release()

    def _go_live(self, run: JournaledRun, slot: Slot) -> Deployment:
        """Activate, health check, commit (a failure propagates to the caller's undo)."""
        with run.step("activate"):
            self._switch(run, active=slot.path, previous=self.slots.target("active"), staged=None)
            run.detail = f"active -> {os.path.relpath(slot.path, self.state_dir)}"
        with run.step("health"):
            run.detail = self.active.health_check()
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
            slot = self.slots.slot("staged")
            if slot is None or self.locked():
                return None
            staged = self.history_log.last(slot.sha256, "staged")
            deployment = staged or Deployment(
                _new_id(), slot.sha256, slot.model_name, slot.model_version, slot.release, ""
            )
            deployment.state, deployment.reason, deployment.finished_at = "running", "", None
            deployment.origin = origin or deployment.origin
            run = JournaledRun(self.journal, deployment, None, None, self._publish)
            run.slot = slot
            run.begin()
            self._snapshot(run)  # interrupted from here on: the staged slot is dropped too
            try:
                return self._go_live(run, slot)
            except StepFailed as failure:
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
            active, previous = self.slots.slot("active"), self.slots.slot("previous")
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
            run = JournaledRun(self.journal, deployment, None, None, self._publish)
            run.begin()
            try:
                with run.step("activate"):
                    self._switch(run, active=previous.path, previous=None)
                    run.detail = f"active -> {_label(previous)} (was {_label(active)}); no previous"
                with run.step("commit"):
                    run.detail = "journaled"
            except StepFailed as failure:
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
            slot = self.slots.slot("staged")
            if slot is None:
                raise DeployError("nothing staged on this device")
            deployment = self.history_log.last(slot.sha256, "staged") or Deployment(
                _new_id(), slot.sha256, slot.model_name, slot.model_version, slot.release, ""
            )
            deployment.state, deployment.finished_at = "running", None
            deployment.origin = origin or deployment.origin
            run = JournaledRun(self.journal, deployment, None, None, self._publish)
            run.slot = slot
            run.begin()
            self._switch(run, staged=None)  # journaled first: a crash restores the link
            reason = f"unstaged before it was activated{_asked_by(origin)}"
            return self._finish(run, "unstaged", reason)

    # -- the steps -----------------------------------------------------------------------------

    def _gate(
        self, run: JournaledRun, engines: list[trials.Candidate], slot: Slot, manifest: Manifest
    ) -> None:
        """The latency gate (:func:`deploy_edge.agent.trials.gate`); the slot records what
        runs."""
        run.detail = trials.gate(
            run.deployment,
            engines,
            slot,
            manifest,
            self.profile,
            self.config,
            self.driver,
        )
        self.slots.write(str(self.slots.slot_name(slot.path)), slot)

    # -- links, staging, rollback, the end of a run --------------------------------------------

    def _switch(self, run: JournaledRun, **links: str | None) -> None:
        """Point the named links (``active``, ``previous``, ``staged``) at bundle paths (None:
        remove), after journaling what they were (the first time in this run)."""
        self._snapshot(run)
        self.slots.set_links(links)

    def _snapshot(self, run: JournaledRun) -> None:
        """Journal the links as they are, once per run: what an undo or a recovery restores."""
        if run.before is None:
            run.before = self.slots.links()
            slot = run.slot.path if run.slot else None
            self.journal.append(
                {"event": "links", "id": run.id, "before": run.before, "slot": slot}
            )

    def _stage(self, run: JournaledRun, slot: Slot) -> Deployment:
        self._switch(run, staged=slot.path)
        lock = self.config.lock_file
        return self._finish(run, "staged", f"robot busy ({lock} exists): activation deferred")

    def _undo(self, run: JournaledRun, failure: StepFailed) -> Deployment:
        self.slots.restore(run.before, run.slot.path if run.slot else None)
        state = "rolled_back" if run.started("activate") else "refused"
        return self._finish(run, state, str(failure))

    def _finish(self, run: JournaledRun, state: str, reason: str = "") -> Deployment:
        """The end record (the commit point for "active"), the history, old slots removed."""
        d = run.deployment
        d.state, d.reason, d.finished_at = state, reason, _now()
        self.journal.append({"event": "end", "id": d.id, "deployment": d.to_json()})
        self.history_log.append(d)
        self._supersede_staged(run)
        self.slots.collect_garbage()
        self._running = None
        if run.on_step is not None:
            run.on_step(copy.deepcopy(d))
        return d

    def _supersede_staged(self, run: JournaledRun) -> None:
        """Record a staged version that ``run`` replaced (or activated past) as refused."""
        dropped = (run.before or {}).get("staged")
        if dropped is None or dropped == self.slots.target("staged"):
            return
        if run.slot is not None and dropped == run.slot.path:
            return
        name = self.slots.slot_name(dropped)
        slot = self.slots.read(name) if name else None
        old = self.history_log.last(slot.sha256, "staged") if slot else None
        if old is not None:
            old.state, old.finished_at = "refused", _now()
            old.reason = f"superseded by deployment {run.id} before it was activated"
            self.history_log.append(old)

    def _start(
        self, release_file: Path, on_step: Callable[[Deployment], None] | None
    ) -> JournaledRun:
        sha = file_sha256(release_file) if release_file.is_file() else ""
        deployment = Deployment(_new_id(), sha, "", "", 0, "running", started_at=_now())
        run = JournaledRun(self.journal, deployment, release_file, on_step, self._publish)
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
            notes = undo_cut_off(self.journal, self.slots, self.history_log)
            notes += self.slots.collect_garbage()
            self._recovered = True
            return notes

    def _recover_once(self) -> None:
        """Recover first if :meth:`recover` was not called: an open deployment in the journal
        must be undone before another changes the links."""
        if not self._recovered:
            self.recover()

    # -- what the device runs ------------------------------------------------------------------

    def status(self) -> DeviceStatus:
        """Active, previous and staged version, the lock, the running and the last deployment,
        the release floor, and what an operator should know (lost state, an expired active
        release)."""
        history = self.history()
        active = self.slots.slot("active")
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
            previous=self.slots.slot("previous"),
            staged=self.slots.slot("staged"),
            locked=self.locked(),
            running=copy.deepcopy(self._running),
            last=history[0] if history else None,
            floor=dict(self.floor.releases),
            notices=notices,
        )

    def history(self) -> list[Deployment]:
        """Every finished deployment, newest first (the latest record of each)."""
        return self.history_log.deployments()

    def run_episode(self, instruction: str | None, max_ticks: int) -> EpisodeResult:
        """One episode of the active version on the device's robot: until the robot says it is
        done or ``max_ticks``. ``instruction`` None: the task the robot's scene poses (a driver
        that has one, like the simulated rp5), else the config's. Versions switch only between
        episodes."""
        if max_ticks < 1:
            raise InputError(f"max_ticks must be >= 1, got {max_ticks}")
        with self._lock:
            self._recover_once()
            slot = self.slots.slot("active")
            if slot is None:
                raise DeployError("no active version on this device: deploy a release first")
            return self.active.episode(slot, instruction, max_ticks)

    def serving_policy(self) -> Served:
        """The active version's policy as the policy server (``WS /policy``) runs it, its
        ``model:version`` and the robot's spec (:meth:`~.active.ActiveVersion.serving`). Does not
        wait on a deployment; :class:`DeployError` when nothing is active."""
        slot = self.slots.slot("active")
        if slot is None:
            raise DeployError("no active version on this device: deploy a release first")
        return self.active.serving(slot)

    def locked(self) -> bool:
        """Whether the robot-busy lock file exists."""
        lock = self.config.lock_file
        return lock is not None and lock.exists()


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
