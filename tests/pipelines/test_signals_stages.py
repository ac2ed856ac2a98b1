"""SIGTERM and Ctrl-C stop ``robo-pipe run`` cleanly in every kind of stage, Ray's included.

One home, one chain of runs through the CLI: a run is stopped while a stage runs, then the same
command runs again, which resumes it (the stages completed before are reused) and is stopped in
the next kind of stage, until a last run completes. The stages that are stopped run where Ray
puts them: Ray Train workers (pretraining), Ray actors (PPO fine-tuning), evaluation workers,
and the deploy onto the local edge agent (its own process). Signals alternate: SIGTERM to the
run's process (``kill``), Ctrl-C as a terminal sends it (SIGINT to the whole foreground process
group, Ray's processes included).

Each stop: exit 143 or 130, one line saying so and no traceback or Ray dump (``*** SIGTERM
received``), no process of the run left (Ray's GCS, raylet and workers, the temporary Prefect
server, the edge agent), their ports free, and the flow run Cancelled in Prefect.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.run.stage_task import STAGES
from tests.pipelines.test_flow import CONFIG
from tests.pipelines.test_serve import SETS, Cli, _kill_all, _port_free, home_processes
from tests.pipelines.test_serve import prefect_flow_runs as flow_runs
from tests.pipelines.test_signals import STOP_BOUND_S, wait_for

RAY_STAGES = [
    "--set", "pretrain.bc.workers=1",  # Ray Train
    "--set", "finetune.algo=ppo",  # rollout workers and a learner: Ray actors
    "--set", "evaluate.workers=1",  # evaluation workers: Ray actors
]  # fmt: skip
"""Every stage that can use Ray does; the deploy starts the local edge agent (the tiny
profile's default)."""


@dataclass(frozen=True)
class Stop:
    """Where a run of the chain is stopped, and how."""

    stage: str
    running: str
    """A process of the home whose command line holds this runs only while the stage does."""
    signum: int


CHAIN = [
    Stop("pretrain", "ray::RayTrainWorker", signal.SIGTERM),
    Stop("finetune", "ray::RolloutWorker", signal.SIGINT),
    Stop("evaluate", "ray::EvalWorker", signal.SIGTERM),
    Stop("deploy", "deploy_edge.agent", signal.SIGINT),
]


def ports_of(processes: list[str]) -> set[int]:
    """The ports the run's servers listen on, from their command lines: the temporary Prefect
    server's (``--port N``) and Ray's GCS (``--gcs_server_port=N``)."""
    found = re.findall(r"(?:--port[ =]|--gcs_server_port=)(\d+)", "\n".join(processes))
    return {int(port) for port in found}


def send(cli: Cli, signum: int) -> None:
    """SIGTERM to the run's process, as ``kill`` sends it; SIGINT to its process group, as
    Ctrl-C at a terminal does (the run leads its own group, as a shell's foreground job)."""
    if signum == signal.SIGINT:
        os.killpg(cli.proc.pid, signum)
    else:
        cli.proc.send_signal(signum)


def running(home: Path, step: Stop) -> bool:
    """The stage ``step`` stops in is running: a process of it is."""
    return any(step.running in process for process in home_processes(home))


def nothing_left(home: Path) -> list[str]:
    """The home's processes still alive once they had :data:`STOP_BOUND_S` to end (Ray's
    workers end when their raylet does, a moment after the run)."""
    deadline = time.monotonic() + STOP_BOUND_S
    while (left := home_processes(home)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.mark.timeout(1200)  # five runs, Ray Train's twice: 7.2 min on two busy cores
def test_a_signal_in_any_stage_stops_everything_and_the_same_command_resumes(
    shared_home: Path,
) -> None:
    home = shared_home
    args = ["run", "--config", CONFIG, *SETS, *RAY_STAGES]
    completed: list[str] = []
    for step in CHAIN:
        run = Cli(args, home)  # as a terminal starts it: Ctrl-C reaches it
        wait_for(f"{step.stage} running", lambda step=step: running(home, step), run, 600)
        ports = ports_of(home_processes(home))
        assert ports, f"the run's servers listen somewhere: {home_processes(home)}"
        start = time.monotonic()
        send(run, step.signum)
        try:
            run.proc.wait(timeout=STOP_BOUND_S)
        finally:
            left = nothing_left(home)
            _kill_all(home)
        output = run.output()
        name = signal.Signals(step.signum).name
        print(f"{step.stage}: {name} stopped the run in {time.monotonic() - start:.1f} s")
        assert run.proc.returncode == 128 + step.signum, output[-3000:]
        assert output.count("interrupted: run the same command again to resume") == 1, output
        for noise in ("Traceback", "*** SIG", "logging.cc", "Aborted"):
            assert noise not in output, f"{name} in {step.stage}: {output[-3000:]}"
        assert not left, f"{name} in {step.stage} left {left}"
        assert all(_port_free(port) for port in ports), f"a server still holds one of {ports}"
        for stage in completed:  # resumed: what the runs before completed is reused
            assert f"\n{stage}: reused (an earlier run's)" in output, output[-3000:]
        completed = [s for s in STAGES if re.search(rf"^{s}: (ok|reused)", output, re.M)]
        assert step.stage not in completed, f"{step.stage} was stopped, not completed"
    states = [r["state"] for r in flow_runs(home).values()]
    assert states == ["CANCELLED"] * len(CHAIN), states
    final = Cli(args, home)
    final.proc.wait(timeout=600)
    output = final.output()
    assert final.proc.returncode == 0, output[-3000:]
    for stage in completed:
        assert f"\n{stage}: reused (an earlier run's)" in output, output[-3000:]
