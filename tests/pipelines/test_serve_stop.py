"""What a stopping ``serve`` leaves in the Prefect API when the runner's own stop runs out of
time (a run's process slow to exit on a loaded machine: seen in CI, where the check in progress
stayed ``Running`` after ``serve`` had exited). The whole stop, through the CLI, is
``test_serve.py``'s SIGTERM test; this one drives :func:`settle_stopped_runs`, the step that
path ends with, against a real Prefect server with runs in each state it meets."""

from __future__ import annotations

import asyncio
from uuid import UUID

import pytest

from pipelines.serve.deployments import SHUTDOWN_MESSAGE, settle_stopped_runs

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_a_stop_leaves_no_run_running_and_gives_finished_runs_their_state_back() -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Completed, Running, State

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("champion_regression")
        deployment = client.create_deployment(flow_id, "check")
        other = client.create_deployment(flow_id, "someone else's")

        def run(*states: State, of: UUID = deployment) -> UUID:
            created = client.create_flow_run_from_deployment(of, state=Running())
            for state in states:
                client.set_flow_run_state(created.id, state, force=True)
            return created.id

        straggler = run()  # its process was signalled; the runner never marked it
        finished_straggler = run(Completed())  # it completed as the signal came
        raced = run(Completed(), Cancelled(message=SHUTDOWN_MESSAGE))
        by_a_user = run(Completed(), Cancelled(message="cancelled from the UI"))
        untouched = run()  # not among the stragglers: left to whoever runs it
        elsewhere = run(Completed(), Cancelled(message=SHUTDOWN_MESSAGE), of=other)

        asyncio.run(settle_stopped_runs([deployment], [straggler, finished_straggler]))

        def state_of(flow_run_id: UUID) -> tuple[str, str | None]:
            state = client.read_flow_run(flow_run_id).state
            assert state is not None
            return state.type.value, state.message

        assert state_of(straggler) == ("CANCELLED", SHUTDOWN_MESSAGE)
        assert state_of(finished_straggler)[0] == "COMPLETED"
        assert state_of(raced)[0] == "COMPLETED", "a run that had finished gets its state back"
        assert state_of(by_a_user) == ("CANCELLED", "cancelled from the UI")
        assert state_of(untouched)[0] == "RUNNING"
        assert state_of(elsewhere)[0] == "CANCELLED", "only the served deployments' runs"
