"""The progress lines: a BC checkpoint shows its loss, an RL one its training success (never a
loss it does not have), and progress reaches every listener of the process."""

from __future__ import annotations

from types import SimpleNamespace

from pipelines.progress import describe, listening, rl_detail


def test_a_checkpoint_is_described_by_what_trained_it() -> None:
    bc = SimpleNamespace(step=600, metrics={"action_loss": 0.0123, "samples_per_s": 850.0})
    rl = SimpleNamespace(step=12, metrics={"env_steps": 9600.0, "success_rate": 0.75})
    assert describe("finetune", bc) == "step 600, loss 0.0123"
    assert describe("finetune", rl) == "iteration 12, training success 75%"
    no_episodes_yet = SimpleNamespace(step=1, metrics={"env_steps": 800.0})
    assert describe("finetune", no_episodes_yet) == "iteration 1, training success -"
    assert rl_detail("sac", {"env_steps_per_s": 1234.5}) == (
        "sac: training success -, 1,234 env-steps/s"
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def started(self, stage: str, total: float | None, unit: str) -> None:
        self.events.append(("started", stage, unit))

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        self.events.append(("advanced", stage, detail))

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        self.events.append(("finished", stage, detail))

    def said(self, stage: str, line: str) -> None:
        self.events.append(("said", stage, line))


def test_progress_reaches_the_listeners_of_the_block_only() -> None:
    from pipelines.progress import BROADCAST

    recorder = Recorder()
    with listening(recorder):
        BROADCAST.started("collect", 10, "episodes")
        BROADCAST.finished("collect", "10 episodes", False)
    BROADCAST.advanced("collect", 5, "after the block")
    assert recorder.events == [
        ("started", "collect", "episodes"),
        ("finished", "collect", "10 episodes"),
    ]
