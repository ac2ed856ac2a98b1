"""What a first run of a shipped config costs, stage by stage: the one place these figures live.

``robo-pipe run`` prints them as it starts (when the config is the shipped one, unchanged);
README.md and docs/benchmarks.md quote their totals, and ``tests/test_docs_figures.py`` checks
that they quote these. A new measurement changes this table, and that test then names every
page to update.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.config import CONFIG_DIR, PipelineConfig, load_config


@dataclass(frozen=True)
class StageTime:
    """One stage of a first run (fresh home: nothing to reuse)."""

    stage: str
    seconds: float
    work: str
    """What the stage did in that time (``2,000 demonstrations``)."""
    measured: bool = True
    """False: an estimate (scaled from a measured figure), to be measured."""


@dataclass(frozen=True)
class FirstRun:
    """A first run of a shipped config: each stage's time, on which machine, from where."""

    config: str
    """The shipped config's file name (``demo.yaml``)."""
    machine: str
    """The cores it ran on and how busy they were."""
    source: str
    """Where the figures come from."""
    stages: tuple[StageTime, ...]

    @property
    def total_s(self) -> float:
        """The whole run: the stages one after another."""
        return sum(stage.seconds for stage in self.stages)

    @property
    def complete(self) -> bool:
        """Every stage measured (none estimated)."""
        return all(stage.measured for stage in self.stages)

    def minutes(self) -> int:
        """The total in whole minutes, as the docs quote it (at least 1)."""
        return max(1, round(self.total_s / 60))


FIRST_RUNS: dict[str, FirstRun] = {
    run.config: run
    for run in (
        FirstRun(
            "demo.yaml",
            "2 busy shared cores (load 5-13)",
            "issue 39 (pretraining's and fine-tuning's training, benchmarks.md) and issue 49 "
            "(pretraining's demonstrations); the rest scaled from them: to be re-measured on "
            "2 quiet cores",
            (
                StageTime("collect", 360, "2,000 demonstrations", measured=False),
                StageTime("pretrain", 540 + 822, "3,000 demonstrations, then 3,000 steps"),
                StageTime("finetune", 343, "1,500 LoRA steps"),
                StageTime("export", 30, "ONNX and INT8", measured=False),
                StageTime("evaluate", 120, "600 held-out episodes", measured=False),
                StageTime("latency", 40, "300 paced control steps", measured=False),
                StageTime("register", 5, "the registry version", measured=False),
                StageTime("deploy", 60, "the agent's checks, one episode", measured=False),
            ),
        ),
    )
}
"""Each shipped config's first run, by file name."""


def first_run(cfg: PipelineConfig) -> FirstRun | None:
    """The measured first run of ``cfg`` when it is a shipped config as shipped (no ``--set``,
    no edit: the same config hash), else None: figures of another config would mislead."""
    for run in FIRST_RUNS.values():
        if load_config(CONFIG_DIR / run.config).config_hash() == cfg.config_hash():
            return run
    return None


def expected_line(run: FirstRun) -> str:
    """``expected on 2 busy shared cores, a first run: collect ~6 min, pretrain ~23 min, ...;
    ~39 min in all ...``: what ``robo-pipe run`` prints as it starts."""
    stages = ", ".join(
        f"{stage.stage} ~{_duration(stage.seconds)}{'' if stage.measured else ' (estimate)'}"
        for stage in run.stages
    )
    return (
        f"expected on {run.machine}, a first run: {stages}; ~{_duration(run.total_s)} in all "
        "(a stage an earlier run completed is reused in seconds; docs/benchmarks.md)"
    )


def _duration(seconds: float) -> str:
    """``45 s`` under two minutes, else ``23 min``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
