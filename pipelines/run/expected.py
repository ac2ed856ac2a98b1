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
    around_s: float = 0.0
    """The run's own work around its stages (its temporary Prefect server, the input checks,
    the summary): the wall time less the stages'."""

    @property
    def total_s(self) -> float:
        """The whole run: the stages one after another, and the work around them."""
        return self.around_s + sum(stage.seconds for stage in self.stages)

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
            "2 quiet cores",
            "issue 49: `robo-pipe run --config configs/demo.yaml` on a fresh home, 643 s wall "
            "(each stage's own 'ok in' figure); on 2 busy shared cores (load 5-13) the same "
            "run took past 40 min",
            (
                StageTime("collect", 21, "2,000 demonstrations"),
                StageTime("pretrain", 320, "3,000 demonstrations, then 3,000 steps"),
                StageTime("finetune", 149, "1,500 LoRA steps"),
                StageTime("export", 28, "ONNX and INT8"),
                StageTime("evaluate", 23, "200 held-out episodes"),
                StageTime("latency", 33, "300 paced control steps"),
                StageTime("register", 1, "the registry version"),
                StageTime("deploy", 37, "the agent's checks, one episode"),
            ),
            around_s=31,
        ),
        FirstRun(
            "quickstart.yaml",
            "2 quiet cores",
            "issue 49: `make quickstart` (`robo-pipe run --config configs/quickstart.yaml`) on "
            "a fresh home, 123 s wall, promoted and deployed (held-out success 93.3%, 95% CI "
            "84.1-97.4%; one success on the local agent)",
            (
                StageTime("collect", 6, "600 demonstrations at 32 px"),
                StageTime("pretrain", 1, "a token base: 12 demonstrations, 10 steps"),
                StageTime("finetune", 63, "1,000 full fine-tuning steps"),
                StageTime("export", 13, "ONNX and INT8"),
                StageTime("evaluate", 10, "60 held-out episodes"),
                StageTime("latency", 0.3, "20 control steps"),
                StageTime("register", 2, "the registry version"),
                StageTime("deploy", 3, "the agent's checks, one episode"),
            ),
            around_s=25,
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
