"""The verbs on demonstrations: ``expert`` (watch the scripted expert solve the task) and
``collect`` (record its demonstrations into a LeRobot v3 dataset). Each checks its inputs, runs
its step on a live display, and shows the record (on stdout; with ``--json`` only the record is
there)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from pipelines.cli.common import emit_json, load, result_console
from pipelines.cli.display import live
from pipelines.cli.options import DEMO_CONFIG, ConfigOpt, JsonOpt, RayAddressOpt, SetOpt, add_verb
from pipelines.config import save_resolved
from pipelines.home import new_run_dir
from pipelines.services.settings import join_cluster
from pipelines.steps import checks
from pipelines.steps.collect import collect_dataset, default_dataset
from robo_pipe.locks import set_run_label

if TYPE_CHECKING:
    from sim_scenes.episodes import EpisodeRecord


def expert(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    episodes: Annotated[
        int | None, typer.Option(min=1, help="Episodes to play (overrides demo.episodes).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Watch the scripted expert solve the task: success rate, filmstrip PNG, GIF, report
    (the whole pipeline is robo-pipe run).

    Writes into a new $ROBO_PIPE_HOME/runs/ID-NAME/ folder: config.yaml (the resolved
    config), report.md, expert_filmstrip.png, expert_episodes.gif and result.json.
    """
    from stages.demo import run_demo

    cfg = load(config, set_, **{"demo.episodes": episodes})
    checks.check_simulator(cfg)
    run_dir = new_run_dir(cfg.name)
    save_resolved(cfg, run_dir / "config.yaml")
    with live(json_out) as display:
        display.started("demo", cfg.demo.episodes, "episodes")
        successes = done = 0

        def tick(episode: EpisodeRecord) -> None:
            nonlocal successes, done
            done, successes = done + 1, successes + episode.success
            display.advanced("demo", done, f"success {successes / done:.1%}")

        report = run_demo(
            cfg.robot, cfg.scene, cfg.sim, cfg.demo, cfg.seed, run_dir, cfg.config_hash(), tick
        )
    low, high = report.success_ci95
    table = Table(title=f"scripted expert on {report.variant}", show_header=False)
    table.add_row("success rate", f"{report.success_rate:.1%}  (95% CI {low:.1%} - {high:.1%})")
    table.add_row("episodes", str(report.episodes))
    table.add_row("mean episode length", f"{report.mean_episode_length:.1f} steps")
    table.add_row("throughput", f"{report.env_steps_per_s:,.0f} env-steps/s")
    table.add_row("report", report.report)
    table.add_row("filmstrip", report.filmstrip)
    result_console(json_out).print(table)
    emit_json(report, json_out)


def collect(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    episodes: Annotated[
        int | None, typer.Option(help="Episodes to attempt (overrides collect.episodes).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Dataset directory (default $ROBO_PIPE_HOME/datasets/NAME-VARIANT-KEY)."),
    ] = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Collect demonstrations into a LeRobot v3 dataset (resumable, appendable).

    Re-running the same command after an interruption continues from the committed episodes
    and ends with the same dataset; a larger --episodes appends to it.
    """
    cfg = load(config, set_, **{"collect.episodes": episodes})
    target = out or default_dataset(cfg)
    checks.check_out_dir(target, "--out")
    checks.check_simulator(cfg)
    join_cluster(ray_address)
    run_dir = new_run_dir(f"{cfg.name}-collect")
    set_run_label(run_dir.name)  # what another run waiting for this dataset is told
    save_resolved(cfg, run_dir / "config.yaml")
    start = time.perf_counter()
    with live(json_out) as display:
        ref = display.step("collect", lambda show: collect_dataset(cfg, show, target, ray_address))
    (run_dir / "dataset_ref.json").write_text(json.dumps(ref.to_json(), indent=2))
    table = Table(title=f"dataset {ref.path}", show_header=False)
    table.add_row("episodes / frames", f"{ref.episodes} / {ref.frames}")
    table.add_row("source success", f"{ref.source_success_rate:.1%} ({ref.source})")
    table.add_row("content hash", ref.content_hash[:16])
    table.add_row("wall time", f"{time.perf_counter() - start:.1f} s")
    result_console(json_out).print(table)
    emit_json(ref, json_out)


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(app, expert, "robo-pipe expert", "robo-pipe expert --episodes 10 --json")
    add_verb(
        app,
        collect,
        "robo-pipe collect",
        "robo-pipe collect --config configs/tiny.yaml --episodes 20 --out data/touch",
    )
