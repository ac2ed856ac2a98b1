"""The evaluate stage: reproducible, checkpoint == ONNX, the gate, worker replacement, bad input."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipelines.config import load_config
from robots.rp5 import RP5
from robots.spec import RobotSpec, get_robot
from sim_scenes.backends import make_env
from sim_scenes.config import SceneConfig, SimConfig, SuccessConfig
from sim_scenes.episodes import play_episodes
from sim_scenes.expert import ScriptedExpert
from sim_scenes.touch import SceneError, sample_layout, touch_variant
from sim_scenes.touch_task import TOUCH
from stages.evaluate import EvalConfig, EvalReport, ShardOutcome, evaluate
from stages.evaluate.comparison import compare
from stages.evaluate.config import SequentialConfig
from stages.evaluate.failures import breakdown, breakdown_line
from stages.evaluate.policies import PolicySpecError
from stages.evaluate.report import VariantRow, summarize
from stages.evaluate.shards import run_suite
from stages.export import export
from stages.policy.checkpoint import new_policy, save_policy
from stages.statistics import two_proportion_test
from stages.worker_pool import WorkersDiedError
from tests.conftest import TINY_CONFIG
from tests.stages.tiny_models import TINY_POLICY

CFG = load_config(TINY_CONFIG)
SMALL = EvalConfig(
    episodes=6,
    workers=0,
    envs_per_worker=4,
    episodes_per_shard=3,
    sequential=SequentialConfig(looks=2),  # a look per shard: batches as wide as the envs
)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    with torch.no_grad():  # a policy that moves: a large action head
        policy.action_head.weight.mul_(20.0)
    path = tmp_path_factory.mktemp("eval") / "ckpt"
    save_policy(policy, path, None)
    return path


SHORT = CFG.scene.model_copy(update={"episode_steps": 15})
"""The suite's scene with short episodes: a failing policy's episodes time out sooner."""


def run(policy: Path, out: Path, config: EvalConfig = SMALL, **kw: object) -> EvalReport:
    return evaluate(policy, CFG.robot, CFG.scene, CFG.sim, config, 0, out, **kw)  # type: ignore[arg-type]


def against_itself(policy: Path, out: Path, config: EvalConfig, **kw: object) -> EvalReport:
    """``policy`` with itself as the baseline, on :data:`SHORT` episodes."""
    return evaluate(policy, CFG.robot, SHORT, CFG.sim, config, 0, out, baseline=policy, **kw)  # type: ignore[arg-type]


def test_report_rows_seeds_files_and_reproducibility(tiny_checkpoint: Path, tmp_path: Path) -> None:
    first = run(tiny_checkpoint, tmp_path / "a")
    assert [r.variant for r in first.rows] == ["touch-mixed-clutter", "touch-mixed-shifted"]
    assert first.episodes == 12 and len(first.seeds) == 6
    assert all(r.episodes == 6 for r in first.rows)
    assert first.env_steps_per_s > 0 and set(first.time_share) >= {
        "simulate",
        "render",
        "inference",
    }
    assert (tmp_path / "a" / "report.md").is_file() and Path(first.plot).is_file()
    assert first.recordings and all(Path(p).is_file() for p in first.recordings)
    assert first.language and first.language.successes == first.successes, "touch: a section"
    assert "## Language" in (tmp_path / "a" / "report.md").read_text()
    again = run(tiny_checkpoint, tmp_path / "b", SMALL.model_copy(update={"envs_per_worker": 2}))
    assert again.outcomes == first.outcomes, "same seeds, same episodes, whatever the batch size"


def test_checkpoint_and_its_onnx_export_agree_episode_by_episode(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    exported = export(tiny_checkpoint, tmp_path / "export", RP5.control_hz)
    assert exported.parity_max_abs_error < 1e-4
    torch_report = run(tiny_checkpoint, tmp_path / "torch")
    onnx_report = run(Path(exported.path), tmp_path / "onnx")
    for a, b in zip(torch_report.outcomes, onnx_report.outcomes, strict=True):
        assert (a["variant"], a["seed"], a["success"], a["length"]) == (
            b["variant"],
            b["seed"],
            b["success"],
            b["length"],
        )
        assert a["episode_return"] == pytest.approx(b["episode_return"], abs=1e-3)


def test_gate_accepts_an_identical_policy_on_the_same_seeds(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    same = run(tiny_checkpoint, tmp_path / "same", baseline=tiny_checkpoint)
    assert same.comparison is not None and same.comparison.passed
    assert same.comparison.difference == 0.0
    assert "Gate against" in (tmp_path / "same" / "report.md").read_text()


VARIANTS = ("touch-mixed-clutter", "touch-mixed-shifted")


def suite_report(
    successes: int,
    episodes: int = 200,
    seeds: list[int] | None = None,
    solved: set[tuple[str, int]] | None = None,
) -> EvalReport:
    """A report of ``episodes`` on two variants and seeds 0..episodes/2-1 (no files): the
    episodes in ``solved`` succeed, by default the first ``successes`` in (variant, seed index)
    order."""
    per_variant = episodes // 2
    keys = [(v, i) for v in VARIANTS for i in range(per_variant)]
    solved = set(keys[:successes]) if solved is None else solved
    rows = [VariantRow(v, per_variant, 0, 0.0, (0.0, 1.0), 10.0) for v in VARIANTS]
    report = EvalReport(
        "policy",
        episodes,
        len(solved),
        len(solved) / episodes,
        (0.0, 1.0),
        rows,
        1.0,
        1.0,
        1.0,
        0.0,
        {},
        0,
        0,
        0,
        seeds if seeds is not None else list(range(per_variant)),
    )
    report.outcomes = [{"variant": v, "index": i, "success": (v, i) in solved} for v, i in keys]
    return report


def test_the_gate_pairs_the_seeds_exact_mcnemar_on_the_discordant_ones() -> None:
    """The issue's worked example: on 200 shared seeds the champion solves 160, the candidate
    148; the candidate fails 16 seeds the champion solved and solves 4 it failed. The pooled
    z-test (the old gate) passes it (p = 0.077); the exact McNemar test on the 20 discordant
    seeds blocks it (p = 0.0059)."""
    keys = [(v, i) for v in VARIANTS for i in range(100)]
    champion = set(keys[:160])
    candidate = set(keys[:144]) | set(keys[160:164])  # fails 144..159, solves 160..163
    worse = compare(suite_report(0, solved=candidate), suite_report(0, solved=champion), 0.95)
    assert worse.test == "exact McNemar" and worse.decision == "worse" and not worse.passed
    assert worse.discordant == {"candidate_only": 4, "baseline_only": 16}
    assert worse.concordant == {"both": 144, "neither": 36}
    assert worse.p_value == pytest.approx(0.0059, abs=1e-4)
    assert worse.boundary == pytest.approx(0.05)
    assert worse.difference == pytest.approx(-0.06) and worse.baseline_success_rate == 0.8
    assert two_proportion_test(148, 200, 160, 200)[2] == pytest.approx(0.077, abs=1e-3)
    # the same rates, seeds nested (the candidate solves a subset of the champion's): worse
    nested = compare(suite_report(148), suite_report(0, solved=champion), 0.95)
    assert nested.discordant == {"candidate_only": 0, "baseline_only": 12} and not nested.passed
    # the discordant seeds split evenly between the two: no evidence of a regression
    even = set(keys[:154]) | set(keys[160:166])  # 6 each way
    assert compare(suite_report(0, solved=even), suite_report(0, solved=champion), 0.95).passed


def test_identical_outcomes_pass_and_a_margin_tolerates_a_small_regression() -> None:
    same = compare(suite_report(180), suite_report(180), confidence=0.95)
    assert same.passed and same.p_value == 1.0 and same.discordant["baseline_only"] == 0
    assert same.detectable_regression > 0.0
    # 176 vs 180 on nested seeds: 4 discordant, all the baseline's: p = 0.5**4 = 0.0625
    slightly = compare(suite_report(176), suite_report(180), confidence=0.95)
    assert slightly.passed and slightly.p_value == pytest.approx(0.0625)
    assert not compare(suite_report(176), suite_report(180), confidence=0.9).passed
    # 20 vs 180: worse, unless a margin of 90 points is tolerated
    assert not compare(suite_report(20), suite_report(180), confidence=0.95).passed
    tolerant = compare(suite_report(20), suite_report(180), 0.95, margin=0.9)
    assert tolerant.passed and tolerant.test == "Newcombe paired interval"
    strict = compare(suite_report(160), suite_report(180), 0.95, margin=0.02)
    assert strict.difference == pytest.approx(-0.1) and not strict.passed
    assert compare(suite_report(176), suite_report(180), 0.95, margin=0.05).passed

    # Only the same seeds make a comparison: another seed list or suite is refused.
    refused = r"^candidate and baseline were not evaluated on the same suite and seeds$"
    with pytest.raises(ValueError, match=refused):
        compare(suite_report(160), suite_report(180, seeds=list(range(1, 101))), 0.95)
    other_suite = suite_report(180)
    other_suite.rows = other_suite.rows[:1]
    with pytest.raises(ValueError, match=refused):
        compare(suite_report(160), other_suite, confidence=0.95)


def test_sequential_evaluation_stops_and_reuses_the_baselines_stored_outcomes(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The baseline's stored outcomes are used instead of playing those seeds: told that the
    baseline solved every seed, the (failing) candidate is worse at the first look, and
    nothing of the baseline was played; told nothing, the baseline (the same policy) plays
    every seed the candidate plays, its outcomes come back to be stored, and identical
    outcomes are never worse."""
    config = SMALL.model_copy(update={"episodes": 12, "episodes_per_shard": 6})
    played: list[int] = []  # the policy of every shard played

    def run_against(out: str, stored: dict[tuple[str, int], bool] | None = None) -> EvalReport:
        played.clear()
        return against_itself(
            tiny_checkpoint,
            tmp_path / out,
            config,
            on_shard=lambda shard: played.append(shard.shard.policy),
            baseline_outcomes=stored,
        )

    stored = {(v, i): True for v in VARIANTS for i in range(12)}
    worse = run_against("w", stored)
    c = worse.comparison
    assert c is not None and c.decision == "worse" and c.look == 1 and c.looks == [6, 12]
    assert c.seeds == 6 and worse.episodes == 12 and len(worse.seeds) == 6
    assert c.baseline_reused == 12 and c.discordant == {"candidate_only": 0, "baseline_only": 12}
    assert c.p_value == pytest.approx(0.5**12) and c.p_value <= c.boundary
    assert worse.baseline_outcomes == {v: "1" * 6 for v in VARIANTS}
    assert played and set(played) == {0}, "the baseline played none of its stored seeds"

    same = run_against("s")
    c = same.comparison
    assert c is not None and c.passed and c.baseline_reused == 0 and c.p_value == 1.0
    assert c.seeds in c.looks and same.episodes == 2 * c.seeds and same.successes == 0
    assert same.baseline_outcomes == {v: "0" * c.seeds for v in VARIANTS}
    assert played.count(1) == played.count(0) > 0, "without stored outcomes both play"
    report = (tmp_path / "s" / "report.md").read_text()
    assert "| **candidate solved** | 0 | 0 |" in report and "80% power" in report
    saved = json.loads((tmp_path / "s" / "eval_report.json").read_text())["comparison"]
    assert saved["test"] == "exact McNemar" and saved["p_value"] == 1.0
    assert saved["discordant"] == {"candidate_only": 0, "baseline_only": 0}


def test_after_not_worse_the_candidate_plays_on_while_its_success_gate_is_undecided(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The (always failing) candidate against itself is "not worse" at the first look (6
    seeds per variant: a 50% regression ruled out). Without a success bar it stops there; with
    a bar of 10% its 0/12 (95% interval up to 24%) and 0/24 (14%) leave the gate undecided,
    so it alone plays on to 18 seeds (0/36: up to 9.6%, below the bar) while the baseline
    plays only the compared seeds. A "worse" candidate never plays on."""
    config = SMALL.model_copy(
        update={
            "episodes": 24,
            "episodes_per_shard": 6,
            "sequential": SequentialConfig(looks=4, regression=0.5),
        }
    )
    played: dict[int, int] = {0: 0, 1: 0}  # episodes played, by policy

    def run_with(out: str, bar: float | None, **kw: object) -> EvalReport:
        played.update({0: 0, 1: 0})
        return against_itself(
            tiny_checkpoint,
            tmp_path / out,
            config,
            on_shard=lambda s: played.update({s.shard.policy: played[s.shard.policy] + 6}),
            min_success=bar,
            **kw,
        )

    quick = run_with("quick", None)
    c = quick.comparison
    assert c is not None and c.decision == "not worse" and (c.look, c.seeds) == (1, 6)
    assert c.played_on == 0 and quick.episodes == 12 and played == {0: 12, 1: 12}

    on = run_with("on", 0.1)
    c = on.comparison
    assert c is not None and c.decision == "not worse" and (c.look, c.seeds) == (1, 6)
    assert c.played_on == 12 and on.episodes == 36 and len(on.seeds) == 18
    assert played == {0: 36, 1: 12}, "only the candidate plays on"
    assert c.table.seeds == 12, "the comparison is the one decided at its look"
    assert on.ci95[1] < 0.1
    assert "played on 12 more seeds per variant (to 18)" in (tmp_path / "on/report.md").read_text()

    stored = {(v, i): True for v in VARIANTS for i in range(24)}
    worse = run_with("worse", 0.1, baseline_outcomes=stored)
    c = worse.comparison
    assert c is not None and c.decision == "worse" and c.played_on == 0 and worse.episodes == 12


def test_a_killed_worker_is_restarted_and_no_episode_counts_twice(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    config = SMALL.model_copy(update={"workers": 2, "episodes": 9})
    reference = run(
        tiny_checkpoint, tmp_path / "reference", config.model_copy(update={"workers": 0})
    )
    killed: list[int] = []
    lines: list[str] = []

    def kill_once(outcome: ShardOutcome) -> None:
        if not killed:  # that worker has just been handed its next shard
            killed.append(outcome.pid)
            os.kill(outcome.pid, signal.SIGKILL)

    report = run(
        tiny_checkpoint, tmp_path / "killed", config, on_shard=kill_once, on_status=lines.append
    )
    assert killed and report.replacements == 1
    assert report.episodes == 18
    keys = [(o["variant"], o["index"]) for o in report.outcomes]
    assert len(set(keys)) == len(keys)
    assert report.outcomes == reference.outcomes
    said = rf"^evaluate worker [12] of 2 \(pid {killed[0]}\) died; restarted as pid \d+, which "
    assert [line for line in lines if re.match(said + r"redid touch-mixed-\w+ episodes", line)]


def test_a_worker_dead_once_too_often_stops_the_evaluation(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    config = SMALL.model_copy(update={"workers": 2, "max_worker_restarts": 0})

    def kill(outcome: ShardOutcome) -> None:
        os.kill(outcome.pid, signal.SIGKILL)

    with pytest.raises(WorkersDiedError, match=r"evaluate.max_worker_restarts = 0 times"):
        run(tiny_checkpoint, tmp_path / "killed", config, on_shard=kill)


def test_bad_suites_and_policies_are_refused_before_any_work(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="at least one variant"):
        EvalConfig(variants=[])
    with pytest.raises(ValueError, match="unknown task 'touch-moon'"):
        EvalConfig(variants=["touch-moon"])
    five_joints, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 5)
    save_policy(five_joints, tmp_path / "wrong", None)
    with pytest.raises(PolicySpecError, match="action_dim 5 != robot's 6"):
        run(tmp_path / "wrong", tmp_path / "out")
    # The same sizes, another robot's: refused by the robot's name, before its sizes.
    elsewhere, _ = new_policy(TINY_POLICY, ["scene"], 32, "hand", 6, 6)
    save_policy(elsewhere, tmp_path / "hand", None)
    with pytest.raises(PolicySpecError, match="policy for robot 'hand' cannot act for robot 'rp5'"):
        run(tmp_path / "hand", tmp_path / "out")
    with pytest.raises(PolicySpecError, match="no such checkpoint"):
        run(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(PolicySpecError, match="action_dim 5"):
        run(tiny_checkpoint, tmp_path / "out", baseline=tmp_path / "wrong")
    assert not (tmp_path / "out").exists()
    empty = SMALL.model_copy(update={"episodes": 0})  # model_copy skips validation
    with pytest.raises(SceneError, match="no episodes"):
        run_suite(tiny_checkpoint, CFG.robot, CFG.scene, CFG.sim, empty, 0)


# -- why episodes failed -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("success", "target", "distractor", "mode"),
    [
        (True, 0.03, 0.02, ""),  # solved wins over everything
        (False, 0.20, 0.04, "wrong_object"),  # went to another object
        (False, 0.20, 0.075, "wrong_object"),  # exactly at radius + margin of it
        (False, 0.20, 0.076, "timeout"),  # nearer a distractor, but never reached it
        (False, 0.05, 0.30, "near_miss"),
        (False, 0.075, 0.30, "near_miss"),  # exactly at radius + margin of the target
        (False, 0.076, 0.30, "timeout"),
        (False, 0.05, 0.06, "near_miss"),  # reached both: the target more closely
        (False, 0.05, math.inf, "near_miss"),  # no other object on the table
        (False, 0.30, math.nan, "timeout"),  # distractors not reported: never wrong_object
    ],
)
def test_failure_modes_on_hand_made_episodes(
    success: bool, target: float, distractor: float, mode: str
) -> None:
    task = SceneConfig(success=SuccessConfig(radius=0.045)).task()
    signals = {"closest_target": target, "closest_distractor": distractor}
    assert TOUCH.failure_mode(success, signals, task) == mode
    # a backend that reports no distances: never told apart
    assert TOUCH.failure_mode(success, {}, task) == ("" if success else "timeout")


def test_the_breakdown_counts_modes_and_the_near_misses_median() -> None:
    modes = ["", "near_miss", "near_miss", "near_miss", "wrong_object", "timeout", ""]
    closest = [0.02, 0.05, 0.07, 0.06, 0.3, 0.2, 0.03]
    signals = [{"closest_target": c} for c in closest]
    counts = breakdown(TOUCH.failure_modes, modes, signals)
    assert {m.name: counts[m.name] for m in TOUCH.failure_modes} == {
        "wrong_object": 1,
        "near_miss": 3,
        "timeout": 1,
    }
    assert counts["near_miss_median_cm"] == pytest.approx(6.0)
    assert counts["near_miss_max_cm"] == pytest.approx(7.0)
    assert breakdown_line(TOUCH.failure_modes, counts) == (
        "wrong object 1, near miss 3 (closest: median 6.0 cm, max 7.0 cm), timeout 1"
    )
    none = breakdown(TOUCH.failure_modes, ["", "timeout"], [{"closest_target": 0.01}, {}])
    assert "near_miss_median_cm" not in none and "near_miss_max_cm" not in none
    assert breakdown_line(TOUCH.failure_modes, none) == "wrong object 0, near miss 0, timeout 1"


def test_a_report_counts_failures_in_the_evaluated_familys_own_modes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The report's table, its line and its plot take their columns from the family of the
    variants evaluated, not from touch's."""
    from types import SimpleNamespace

    from sim_scenes import tasks
    from stages.evaluate.report import failures_markdown
    from stages.evaluate.shards import EpisodeOutcome

    modes = (
        tasks.FailureMode("no_grasp", "no grasp", "never held the object"),
        tasks.FailureMode(
            "dropped", "dropped", "let go before the goal", "drop", "height", "mm", 1e3
        ),
    )
    family = SimpleNamespace(failure_modes=modes, variant_names=lambda split=None: ["pick"])
    monkeypatch.setitem(tasks.TASKS, "grasp", f"{__name__}:_GRASP")
    monkeypatch.setitem(globals(), "_GRASP", family)
    tasks.task_family.cache_clear()
    try:
        episodes = [
            EpisodeOutcome("grasp/pick", i, i, f == "", 10, 0.0, "pick it", {"drop": d}, f)
            for i, (f, d) in enumerate([("", 0.0), ("dropped", 0.02), ("no_grasp", 0.0)])
        ]
        facts = {"variants": ["grasp/pick"], "wall_s": 1.0, "startup_s": 0.0, "workers": 0}
        facts |= {"replacements": 0, "seeds": [0, 1, 2], "phrasing": "trained"}
        report = summarize("p", [ShardOutcome(None, episodes)], facts, 0)  # type: ignore[arg-type]
        table = "\n".join(failures_markdown(report))
    finally:
        tasks.task_family.cache_clear()
    assert report.failures == {
        "no_grasp": 1,
        "dropped": 1,
        "dropped_median_mm": 20.0,
        "dropped_max_mm": 20.0,
    }
    assert "| variant | successes | no grasp | dropped | dropped: height, median (max) |" in table
    assert "| all | 1 | 1 | 1 | 20.0 mm (20.0 mm) |" in table
    assert "wrong object" not in table
    assert report.why_failed() == "no grasp 1, dropped 1 (height: median 20.0 mm, max 20.0 mm)"


def test_an_expert_held_to_a_radius_it_cannot_reach_nearly_misses(rp5: RobotSpec) -> None:
    # The expert presses on the named object (~2.8 cm from its centre): held to 1 cm it goes
    # to the right object every time and runs out of time there, which is a near miss.
    scene = SceneConfig(success=SuccessConfig(radius=0.01, hold_steps=3))
    env = make_env(rp5, scene, SimConfig(num_threads=1), num_envs=3, cameras=(), autoreset=False)
    with env:
        records = play_episodes(
            env, ScriptedExpert(rp5), [61, 62, 63], signals=TOUCH.episode_signals
        )
    modes = [TOUCH.failure_mode(r.success, r.signals, scene.task()) for r in records]
    assert modes == ["near_miss"] * 3
    assert all(r.length == 50 for r in records)
    assert all(r.signals["closest_target"] <= r.signals["final_target"] for r in records)


def test_every_report_says_why_episodes_failed(tiny_checkpoint: Path, tmp_path: Path) -> None:
    report = run(tiny_checkpoint, tmp_path)
    episodes = report.outcomes
    assert all(o["failure"] in ("", *(m.name for m in TOUCH.failure_modes)) for o in episodes)
    assert all((o["failure"] == "") == o["success"] for o in episodes)
    assert all(0.0 < o["signals"]["closest_target"] < 1.0 for o in episodes)
    assert all(o["signals"]["closest_target"] <= o["signals"]["final_target"] for o in episodes)
    names = [m.name for m in TOUCH.failure_modes]
    assert [m.name for m in report.failure_modes()] == names, "the evaluated family's modes"
    failed = sum(report.failures[m] for m in names)
    assert failed == report.episodes - report.successes
    assert sum(sum(r.failures[m] for m in names) for r in report.rows) == failed
    text = Path(report.report).read_text()
    assert "## Why episodes failed" in text
    assert f"| all | {report.successes} | {int(report.failures['wrong_object'])} |" in text
    again = EvalReport.from_json(json.loads(Path(tmp_path / "eval_report.json").read_text()))
    assert again.failures == report.failures
    older = report.to_json()
    del older["failures"]
    for row in older["rows"]:
        del row["failures"]
    assert EvalReport.from_json(older).failures == {}, "reports from before the breakdown load"


def test_the_evaluate_verb_plays_the_unseen_phrasings_and_says_so(
    tiny_checkpoint: Path, robo_pipe_home: Path
) -> None:
    """``robo-pipe evaluate --phrasing unseen``: every episode's instruction is an unseen
    phrasing of the seed's own scene, and the record, report.md and the table say "unseen";
    a phrasing that does not exist is refused (exit 2, one line naming it)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "ROBO_PIPE_HOME": str(robo_pipe_home), "COLUMNS": "200"}
    small = ["--config", str(TINY_CONFIG), "--episodes", "1", "--set", "evaluate.workers=0"]

    def robo_pipe(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pipelines.cli", "evaluate", str(tiny_checkpoint)]
        return subprocess.run(
            [*command, *small, *args], cwd=root, env=env, capture_output=True, text=True
        )

    unseen = robo_pipe("--phrasing", "unseen", "--json")
    assert unseen.returncode == 0, unseen.stderr[-3000:]
    record = json.loads(unseen.stdout.strip().splitlines()[-1])
    assert record["phrasing"] == "unseen"
    assert "instructions: unseen phrasings" in " ".join(unseen.stderr.split())
    assert "**unseen** phrasings" in Path(record["report"]).read_text()
    report = EvalReport.from_json(
        json.loads((Path(record["report"]).parent / "eval_report.json").read_text())
    )
    assert report.episodes == len(report.rows) == len(report.outcomes) >= 2
    for o in report.outcomes:
        task = SceneConfig(**CFG.scene.model_dump(exclude={"variant"}), variant=o["variant"])
        layout = sample_layout(
            touch_variant(task.task()), get_robot(CFG.robot), o["seed"], phrasing="unseen"
        )
        assert o["instruction"] == layout.instruction
    novel = robo_pipe("--phrasing", "novel")
    shown = " ".join(novel.stderr.split())
    assert novel.returncode == 2 and "novel" in shown and "Traceback" not in shown, shown
