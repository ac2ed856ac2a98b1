"""A deployment under way: its record, journaled step by step.

Each step is journaled before it runs and after (``state_dir/journal.jsonl``, fsynced), so that
a cut-off deployment can be undone at the next start (:meth:`Deployer.recover`). A failing step
raises :class:`StepFailed`, which the deployer turns into a rollback.

Fault injection: with ``ROBO_PIPE_AGENT_CRASH_AT=<step>`` in the environment the process kills
itself (SIGKILL) right after journaling that step's start.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from deploy_edge.agent.journal import Journal
from deploy_edge.agent.trials import Refused
from deploy_edge.release.header import ReleaseError
from deploy_edge.wire import Deployment, Slot, StepResult

CRASH_ENV = "ROBO_PIPE_AGENT_CRASH_AT"
"""Fault injection: the step at whose start the process SIGKILLs itself."""


class StepFailed(Exception):
    """A step failed: the deployment is undone."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step, self.detail = step, detail


class JournaledRun:
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
        raises :class:`StepFailed`."""
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
            raise StepFailed(name, failure)

    def started(self, name: str) -> bool:
        return self.deployment.step(name) is not None
