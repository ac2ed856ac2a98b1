"""The expert demo: the scripted expert solving the task, measured and filmed.

It builds the scene, plays ``demo.episodes`` seeded episodes (the run's ``demo`` seed stream)
with the scripted expert across the batched simulator, and writes a report (success rate with a
95% Wilson interval, episode length, throughput), a filmstrip PNG and an animated GIF of the
first episodes, and the report as JSON. ``robo-pipe expert`` runs it: a first look at the task and
the simulator before any training, and the ceiling a policy trained on these demonstrations
can reach.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from robo_pipe.records import Record
from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.episodes import EpisodeRecord, play_episodes
from sim_scenes.seeds import episode_seeds
from sim_scenes.tasks import resolve_task
from stages.demo.config import DemoConfig
from stages.statistics import wilson_interval


@dataclass
class DemoReport(Record):
    """Result record of the expert demo (JSON-serialisable)."""

    run_dir: str
    config_hash: str
    robot: str
    variant: str
    episodes: int
    successes: int
    success_rate: float
    success_ci95: tuple[float, float]
    mean_episode_length: float
    """Control steps."""
    env_steps_per_s: float
    wall_s: float
    filmstrip: str
    animation: str
    report: str


def run_demo(
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    config: DemoConfig,
    seed: int,
    out: Path,
    config_hash: str = "",
    on_episode: Callable[[EpisodeRecord], None] | None = None,
) -> DemoReport:
    """Play the expert demo on ``scene`` and write its outputs into ``out``; ``config_hash``
    names the pipeline config it was run from (shown in the report)."""
    out.mkdir(parents=True, exist_ok=True)
    spec = get_robot(robot)
    seeds = episode_seeds(seed, config.episodes, "demo")
    task, _ = resolve_task(scene.variant)
    expert = task.expert(spec)
    num_envs = min(sim.num_envs, len(seeds))
    start = time.perf_counter()
    with make_env(spec, scene, sim, num_envs=num_envs, autoreset=False) as env:
        records = play_episodes(
            env, expert, seeds, record=config.filmstrip_episodes, on_episode=on_episode
        )
    wall = time.perf_counter() - start

    successes = sum(r.success for r in records)
    steps = sum(r.length for r in records)
    recorded = [r for r in records if r.frames]
    filmstrip = _save_filmstrip(recorded, out / "expert_filmstrip.png")
    animation = _save_animation(recorded, out / "expert_episodes.gif", spec.control_hz)
    report = DemoReport(
        run_dir=str(out),
        config_hash=config_hash,
        robot=spec.name,
        variant=scene.variant,
        episodes=len(records),
        successes=successes,
        success_rate=successes / len(records),
        success_ci95=wilson_interval(successes, len(records)),
        mean_episode_length=steps / len(records),
        env_steps_per_s=steps / wall,
        wall_s=wall,
        filmstrip=str(filmstrip),
        animation=str(animation),
        report=str(out / "report.md"),
    )
    _write_markdown(report, records, out / "report.md")
    (out / "result.json").write_text(json.dumps(asdict(report), indent=2))
    return report


def _label(frame: np.ndarray, text: str, scale: int) -> Image.Image:
    img = Image.fromarray(frame).resize(
        (frame.shape[1] * scale, frame.shape[0] * scale), Image.Resampling.NEAREST
    )
    ImageDraw.Draw(img).text((3, 2), text, fill=(255, 255, 255))
    return img


def _save_filmstrip(records: list[EpisodeRecord], path: Path, columns: int = 8) -> Path:
    """One row per episode: ``columns`` frames evenly spaced from first to last."""
    rows = []
    for rec in records:
        picks = np.linspace(0, len(rec.frames) - 1, min(columns, len(rec.frames))).round()
        tiles = [_label(rec.frames[int(k)], f"t={int(k)}", 3) for k in picks]
        caption = Image.new("RGB", (tiles[0].width * columns, 16), (20, 20, 20))
        outcome = "success" if rec.success else "failure"
        ImageDraw.Draw(caption).text(
            (4, 2), f'"{rec.instruction}" - {outcome}', fill=(255, 255, 255)
        )
        row = Image.new("RGB", (tiles[0].width * columns, tiles[0].height + 16))
        row.paste(caption, (0, 0))
        for c, tile in enumerate(tiles):
            row.paste(tile, (c * tile.width, 16))
        rows.append(row)
    sheet = Image.new("RGB", (rows[0].width, sum(r.height for r in rows)))
    y = 0
    for row in rows:
        sheet.paste(row, (0, y))
        y += row.height
    sheet.save(path)
    return path


def _save_animation(records: list[EpisodeRecord], path: Path, control_hz: float) -> Path:
    """The recorded episodes side by side, played at the control rate."""
    length = max(len(r.frames) for r in records)
    frames = []
    for t in range(length):
        tiles = [_label(r.frames[min(t, len(r.frames) - 1)], r.instruction, 4) for r in records]
        frame = Image.new("RGB", (sum(tile.width for tile in tiles), tiles[0].height))
        for c, tile in enumerate(tiles):
            frame.paste(tile, (c * tile.width, 0))
        frames.append(frame)
    frames[0].save(
        path, save_all=True, append_images=frames[1:], duration=int(1000 / control_hz), loop=0
    )
    return path


def _write_markdown(report: DemoReport, records: list[EpisodeRecord], path: Path) -> None:
    low, high = report.success_ci95
    lines = [
        f"# robo-pipe expert: scripted expert on `{report.variant}`",
        "",
        "| metric | value |",
        "|---|---|",
        f"| robot | {report.robot} |",
        f"| episodes | {report.episodes} |",
        f"| success rate | {report.success_rate:.1%} (95% CI {low:.1%} - {high:.1%}) |",
        f"| mean episode length | {report.mean_episode_length:.1f} control steps |",
        f"| throughput | {report.env_steps_per_s:,.0f} env-steps/s (with rendering and expert) |",
        f"| wall time | {report.wall_s:.1f} s |",
        f"| config hash | `{report.config_hash}` |",
        "",
        "![expert filmstrip](expert_filmstrip.png)",
        "",
        "## First episodes",
        "",
        "| seed | instruction | success | steps |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r.seed} | {r.instruction} | {'yes' if r.success else 'no'} | {r.length} |"
        for r in records[:10]
    ]
    path.write_text("\n".join(lines) + "\n")
