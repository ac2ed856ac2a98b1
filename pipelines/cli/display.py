"""What the verbs show of their stages' progress (a :class:`~pipelines.progress.Listener`):
live rows in a terminal, plain lines in a log (the result tables are in
:mod:`pipelines.cli.result_tables`)."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from pipelines.cli.common import console
from pipelines.progress import Listener, describe

T = TypeVar("T")

PROGRESS_EVERY_S = 30.0
"""Outside a terminal: how often a running stage prints its progress line, at least."""


def watched(out: Console) -> bool:
    """Whether a person watches ``out`` live: a terminal rich animates (not ``TERM=dumb``, not
    ``TTY_INTERACTIVE=0``). ``FORCE_COLOR`` makes rich treat a log file as a terminal, so the
    file must be a TTY as well: a CI log gets colours and plain lines, never cursor moves."""
    return out.is_interactive and out.file.isatty()


class StageDisplay(ABC):
    """What a verb shows of its stages' progress (a :class:`~pipelines.progress.Listener`):
    :class:`LiveRows` in a terminal, :class:`StageLog` in a log."""

    @abstractmethod
    def started(self, stage: str, total: float | None, unit: str) -> None:
        """``stage`` began: ``total`` units of ``unit`` (None: unknown)."""

    @abstractmethod
    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """``completed`` units done (0: only ``detail`` changed)."""

    @abstractmethod
    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """``stage`` ended with ``detail``; ``reused``: an earlier run's record."""

    @abstractmethod
    def said(self, stage: str, line: str) -> None:
        """A line to keep in the output."""

    def step(self, stage: str, run: Callable[[Listener], T]) -> T:
        """Run one step with its progress on this display; returns its record."""
        record = run(self)
        self.finished(stage, describe(stage, record), reused=False)
        return record


class OwnElapsed(TimeElapsedColumn):
    """A row's elapsed time, blank for a row the display only saw end (a reused stage, a
    device's step that reports its own duration in its status): it measured none of its own."""

    def render(self, task: Task) -> Text:
        """The elapsed time of a timed row, else nothing."""
        return super().render(task) if task.fields.get("timed") else Text("")


class TimeLeft(TimeRemainingColumn):
    """A running row's estimated time left (``~0:01:41 left``), blank where there is no
    estimate: no total, nothing counted yet, or the row is done."""

    def render(self, task: Task) -> Text:
        """The estimate of a counting row, else nothing."""
        if not task.total or task.finished or task.time_remaining is None:
            return Text("")
        left = timedelta(seconds=round(task.time_remaining))
        return Text(f"~{left} left", style="progress.remaining")


class LiveRows(StageDisplay):
    """One progress row per stage: name, bar, percent, the stage's status line, elapsed, time
    left (rich's estimate from the row's recent pace). Shown
    on ``out`` while :attr:`progress` is entered; ``transient``: gone when it exits; ``clock``
    gives the time in seconds (a test passes its own)."""

    def __init__(
        self, out: Console, transient: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description:>9}"),
            BarColumn(bar_width=30),
            TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[detail]}"),
            OwnElapsed(),
            TimeLeft(),
            console=out,
            transient=transient,
            get_time=clock,
        )
        self.rows: dict[str, TaskID] = {}

    def _row(self, stage: str, total: float | None) -> TaskID:
        if stage not in self.rows:
            self.rows[stage] = self.progress.add_task(stage, total=total, detail="", timed=False)
        return self.rows[stage]

    def started(self, stage: str, total: float | None, unit: str) -> None:
        """A (new) row for ``stage``; a known ``total`` makes it a bar (``unit`` is shown)."""
        row = self._row(stage, total)
        self.progress.reset(row, total=total, detail=unit, timed=True)

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """Move ``stage``'s bar to ``completed`` (0: keep it) and show ``detail``; a row first
        seen here is timed from now."""
        row = self._row(stage, None)
        if completed:
            self.progress.update(row, completed=completed, detail=detail, timed=True)
        else:
            self.progress.update(row, detail=detail, timed=True)

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """Fill ``stage``'s bar and show what it produced (a device step that failed in red)."""
        row = self._row(stage, 1)
        total = self.progress.tasks[row].total or 1
        note = " (reused from an earlier run)" if reused else ""
        style = "red" if detail.startswith("FAILED") else "green"
        self.progress.update(row, total=total, completed=total, detail=f"[{style}]{detail}{note}")

    def said(self, stage: str, line: str) -> None:
        """Print ``line`` above the rows (it stays when the live display is gone) and show it
        as ``stage``'s status."""
        self.progress.console.print(f"{stage}: {line}", highlight=False, soft_wrap=True)
        self.advanced(stage, 0, line)


@dataclass
class _Running:
    """What :class:`StageLog` knows of one stage."""

    since: float | None
    """When the log first heard of it (None: only its end was seen: no duration measured)."""
    last_line: float
    """When the log last printed a line about it."""
    total: float | None = None
    unit: str = ""
    completed: float = 0.0
    counting_since: float | None = None
    """When the current count began (the last :meth:`StageLog.started`): the ETA's rate is
    taken from it, so a stage that counts one thing, then another (pretraining: its
    demonstrations, then its steps) estimates each from its own pace."""
    detail: str = ""
    ended: bool = False


class StageLog(StageDisplay):
    """Plain lines for a log (stderr is not a terminal: CI, ``make demo > log``), never wrapped
    (a path stays whole on its line):

    - one line per stage as it ends: ``collect: ok in 83.2 s: 2000 episodes, 120000 frames``,
      ``pretrain: reused (an earlier run's): step 600, loss 0.0123``; a device's step, whose
      status carries its own verdict and duration: ``verify: ok (3.5 s)``;
    - while a stage runs, a progress line at least every ``every_s`` seconds (:meth:`tick`):
      ``finetune: 45% (270 of 600 BC steps), 0:01:23 elapsed: loss 0.0123, 850 samples/s``;
    - what a stage says (waiting for another run), when it says it.

    ``clock`` gives the time in seconds (a test passes its own)."""

    def __init__(
        self,
        out: Console,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out, self.every_s, self.clock = out, every_s, clock
        self.stages: dict[str, _Running] = {}
        self.lock = threading.Lock()  # the Prefect tasks report from their own threads

    def _print(self, line: str) -> None:
        self.out.print(line, markup=False, highlight=False, soft_wrap=True)

    def _running(self, stage: str) -> _Running:
        state = self.stages.get(stage)
        if state is None or state.ended:
            now = self.clock()
            state = self.stages[stage] = _Running(since=now, last_line=now)
        return state

    def started(self, stage: str, total: float | None, unit: str) -> None:
        """``stage`` runs; started again (BC, then RL fine-tuning) it keeps its first start."""
        with self.lock:
            state = self._running(stage)
            state.total, state.unit, state.completed = total, unit, 0.0
            state.counting_since = self.clock()

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """Remember ``stage``'s progress for its next progress line."""
        with self.lock:
            state = self._running(stage)
            state.completed = completed or state.completed
            state.detail = detail

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """The stage's line: ok and its duration (measured from its start), or reused."""
        with self.lock:
            state = self.stages.get(stage)
            since = state.since if state is not None and not state.ended else None
            now = self.clock()
            self.stages[stage] = _Running(since=since, last_line=now, ended=True)
            if reused:
                self._print(f"{stage}: reused (an earlier run's): {detail}")
            elif since is None:  # only its end was seen: its detail says how it went
                self._print(f"{stage}: {detail}")
            else:
                self._print(f"{stage}: ok in {now - since:.1f} s: {detail}")

    def said(self, stage: str, line: str) -> None:
        """Print ``stage: line`` now."""
        with self.lock:
            state = self._running(stage)
            state.detail, state.last_line = line, self.clock()
            self._print(f"{stage}: {line}")

    def tick(self) -> None:
        """A progress line for each running stage whose last line is ``every_s`` old."""
        with self.lock:
            now = self.clock()
            for stage, state in self.stages.items():
                if not state.ended and now - state.last_line >= self.every_s:
                    state.last_line = now
                    self._print(_progress_line(stage, state, now))

    @contextmanager
    def ticking(self) -> Iterator[None]:
        """Call :meth:`tick` every second in a thread inside the block: a stage that reports
        nothing for minutes (a long export, a slow first shard) still shows it runs."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(min(1.0, self.every_s)):
                self.tick()

        thread = threading.Thread(target=loop, name="stage-log", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _progress_line(stage: str, state: _Running, now: float) -> str:
    """``finetune: 45% (270 of 600 BC steps), 0:01:23 elapsed, ~0:01:41 left: <its latest
    status>`` (no estimate before the first unit is done)."""
    if state.total:
        share = state.completed / state.total
        done = f"{share:.0%} ({state.completed:,.0f} of {state.total:,.0f} {state.unit})"
    elif state.completed:
        done = f"{state.completed:,.0f} {state.unit}".rstrip()
    else:
        done = "running"
    since = now if state.since is None else state.since
    line = f"{stage}: {done}, {timedelta(seconds=int(now - since))} elapsed"
    if (left := _seconds_left(state, now)) is not None:
        line += f", ~{timedelta(seconds=round(left))} left"
    return f"{line}: {state.detail}" if state.detail else line


def _seconds_left(state: _Running, now: float) -> float | None:
    """The rest of the current count at its pace so far: its elapsed time times what is left
    over what is done (None: no total, nothing done yet, or done)."""
    if not state.total or state.completed <= 0 or state.counting_since is None:
        return None
    if state.completed >= state.total:
        return None
    counted_for = now - state.counting_since
    return counted_for * (state.total - state.completed) / state.completed


@contextmanager
def live(json_out: bool = False) -> Iterator[StageDisplay]:
    """The stages' progress on stderr: live rows in a terminal (with ``--json`` they disappear
    when done, leaving the terminal to the result); elsewhere plain lines (:class:`StageLog`)."""
    if not watched(console):
        log = StageLog(console)
        with log.ticking():
            yield log
        return
    rows = LiveRows(console, transient=json_out)
    with rows.progress:
        yield rows
