"""What a first run of a shipped config takes, kept in one place (pipelines/run/expected.py):
printed by ``robo-pipe run`` for that config as shipped, and never for another config."""

from __future__ import annotations

from dataclasses import replace

from pipelines.config import CONFIG_DIR, load_config
from pipelines.run.expected import FIRST_RUNS, expected_line, first_run
from pipelines.run.stage_task import STAGES


def test_each_shipped_config_gets_its_own_figures_and_no_other_config_any() -> None:
    for name, run in FIRST_RUNS.items():
        assert (CONFIG_DIR / name).is_file(), name
        assert tuple(stage.stage for stage in run.stages) == STAGES, "every stage, in order"
        assert first_run(load_config(CONFIG_DIR / name)) is run
    # Another config's figures would mislead: changed by --set, or not measured (tiny keeps
    # the demo's name but not its sizes).
    assert first_run(load_config(CONFIG_DIR / "demo.yaml", ["collect.episodes=100"])) is None
    assert first_run(load_config(CONFIG_DIR / "tiny.yaml")) is None


def test_the_line_run_prints_gives_each_stage_and_the_total() -> None:
    demo = FIRST_RUNS["demo.yaml"]
    line = expected_line(demo)
    assert line.startswith(f"expected on {demo.machine}, a first run: collect ~")
    assert all(f"{stage} ~" in line for stage in STAGES), line
    assert demo.complete and "(estimate)" not in line, "every stage of the demo is measured"
    # A stage not measured says it is an estimate.
    guessed = replace(demo, stages=(replace(demo.stages[0], measured=False), *demo.stages[1:]))
    assert expected_line(guessed).count("(estimate)") == 1
    assert f"~{demo.minutes()} min in all" in line
    assert demo.total_s > sum(s.seconds for s in demo.stages), "and the work around the stages"
