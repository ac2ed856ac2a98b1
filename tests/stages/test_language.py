"""The language section of an evaluation: success where a word is needed against a policy
that ignores it, chance for the corrupted controls, the words played, the exact
Poisson-binomial tail behind the p-values, and the benchmark's use of them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from robots.spec import RobotSpec
from sim_scenes.tasks import EpisodeWords, task_family
from stages.evaluate.language import language_baselines, language_markdown, suite_language
from stages.evaluate.report import EvalReport, markdown, summarize
from stages.evaluate.shards import EpisodeOutcome, ShardOutcome
from stages.statistics import poisson_binomial_tail

SEEDS = list(range(200))


def brute_force_tail(probabilities: list[float], successes: int) -> float:
    """P(X >= successes) by summing every outcome of the trials."""
    return sum(
        math.prod(p if hit else 1 - p for p, hit in zip(probabilities, hits, strict=True))
        for hits in itertools.product((False, True), repeat=len(probabilities))
        if sum(hits) >= successes
    )


@pytest.mark.parametrize(
    "probabilities", [[0.5, 0.25, 1 / 3, 1.0, 0.2, 0.0], [0.5, 0.5, 1 / 3, 1 / 3, 0.25, 0.9, 0.1]]
)
def test_poisson_binomial_tail_matches_brute_force(probabilities: list[float]) -> None:
    for k in range(len(probabilities) + 2):
        assert poisson_binomial_tail(probabilities, k) == pytest.approx(
            brute_force_tail(probabilities, k), abs=1e-12
        ), k


def test_poisson_binomial_tail_is_the_binomial_for_equal_chances() -> None:
    for k in (0, 1, 30, 55, 80, 120):
        expected = binom.sf(k - 1, 120, 0.4)
        assert poisson_binomial_tail([0.4] * 120, k) == pytest.approx(expected, rel=1e-9)
    assert poisson_binomial_tail([0.5] * 200, 200) == pytest.approx(0.5**200, rel=1e-9)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        poisson_binomial_tail([0.5, 1.5], 1)


def words(variant: str, rp5: RobotSpec, seed: int, phrasing: str = "trained") -> EpisodeWords:
    """The touch family's words of ``seed``'s episode (the task seam the section reads)."""
    drawn = task_family("touch").episode_words(variant, rp5, seed, phrasing)
    assert drawn is not None
    return drawn


def colour_needed(variant: str, rp5: RobotSpec) -> list[bool]:
    return [words(variant, rp5, s).needed("colour") for s in SEEDS]


def test_a_policy_that_ignores_the_colour_word_sits_at_its_baseline(rp5: RobotSpec) -> None:
    """touch-mixed: where the colour word is needed, ignoring it leaves 2 objects of the
    target's shape. A policy that reads only the shape solves every other seed and half of
    those (as picking 1 of 2 would): at the baseline, not significant. One that reads the
    colour solves them all: far above it. One that fails wherever colour is needed: below."""
    needed = colour_needed("touch-mixed", rp5)
    assert 60 < sum(needed) < 140, "about half the seeds need the colour word"
    order = itertools.count()
    shape_reader = [not n or next(order) % 2 == 0 for n in needed]
    lang = language_baselines("touch-mixed", rp5, SEEDS, shape_reader, "unseen-colour")
    assert lang is not None
    colour = lang.kind("colour")
    assert colour is not None and colour.episodes == sum(needed)
    assert colour.ignore_baseline == pytest.approx(0.5)
    assert colour.success_rate == pytest.approx(0.5, abs=0.01)
    assert colour.p_value > 0.3, "no evidence the colour word was read"
    reader = language_baselines("touch-mixed", rp5, SEEDS, [True] * len(SEEDS), "unseen-colour")
    assert reader is not None and reader.kind("colour").p_value < 1e-9  # type: ignore[union-attr]
    blind = language_baselines("touch-mixed", rp5, SEEDS, [not n for n in needed], "trained")
    assert blind is not None and blind.kind("colour").success_rate == 0.0  # type: ignore[union-attr]
    assert blind.kind("colour").p_value == 1.0  # type: ignore[union-attr]
    # The colour twin: the shape word is needed on every seed, with 2 objects of its colour.
    shape = lang.kind("shape")
    assert shape is not None and shape.episodes == len(SEEDS) and shape.ignore_baseline == 0.5


def test_the_controls_are_compared_with_chance(rp5: RobotSpec) -> None:
    """touch-mixed-clutter holds 4 objects: chance is 1/4. A policy that solves every fourth
    seed is at chance; one that solves them all found the target without the instruction."""
    at_chance = [s % 4 == 0 for s in SEEDS]
    lang = language_baselines("touch-mixed-clutter", rp5, SEEDS, at_chance, "absent")
    assert lang is not None and lang.chance == pytest.approx(0.25)
    assert lang.chance_p_value > 0.3
    text = "\n".join(language_markdown(lang))
    assert "corrupted control (`absent`)" in text and "Chance (a policy that reads nothing" in text
    cheat = language_baselines("touch-mixed-clutter", rp5, SEEDS, [True] * 200, "absent")
    assert cheat is not None and cheat.chance_p_value < 1e-20


def test_the_controls_compare_the_objects_gone_for_with_chance(rp5: RobotSpec) -> None:
    """A policy that goes for no object in half the episodes and for a random one otherwise
    succeeds below chance, yet its choice among objects is at chance; one that always goes for
    the named object, touching it or not, chose it far above chance. Failure modes say which:
    touch's ``near_miss`` went for the target, ``wrong_object`` for another, ``timeout`` none."""
    clutter = [words("touch-mixed-clutter", rp5, s, "nonce") for s in SEEDS]
    assert all(w.candidates["both"] == 4 for w in clutter)
    rng = np.random.default_rng(1)
    went = rng.random(200) < 0.5
    named = rng.integers(0, 4, 200) == 0
    success = list(went & named & (rng.random(200) < 0.5))
    failures = [
        "" if ok else ("timeout" if not g else ("near_miss" if n else "wrong_object"))
        for ok, g, n in zip(success, went, named, strict=True)
    ]
    lang = language_baselines("touch-mixed-clutter", rp5, SEEDS, success, "nonce", failures)
    assert lang is not None and lang.went_for_object == int(went.sum())
    assert lang.went_for_target == int((went & named).sum())
    assert lang.choice_chance == pytest.approx(0.25)
    assert lang.successes / lang.episodes < lang.chance - 0.05, "success falls below chance"
    assert lang.choice_p_value is not None and lang.choice_p_value > 0.05
    text = "\n".join(language_markdown(lang))
    share = lang.went_for_target / lang.went_for_object
    assert f"in {lang.went_for_object} of 200 episodes; for the named one in {share:.1%}" in text

    led = ["" if ok else "near_miss" for ok in success]
    reader = language_baselines("touch-mixed-clutter", rp5, SEEDS, success, "nonce", led)
    assert reader is not None and reader.went_for_object == reader.went_for_target == 200
    assert reader.choice_p_value is not None and reader.choice_p_value < 1e-50
    unknown = language_baselines("touch-mixed-clutter", rp5, SEEDS, success, "nonce")
    assert unknown is not None and unknown.went_for_object is None
    assert "went for an object" not in "\n".join(language_markdown(unknown))


def test_the_words_played_are_counted(rp5: RobotSpec) -> None:
    lang = language_baselines("touch-mixed-all", rp5, SEEDS, [False] * 200, "unseen")
    assert lang is not None
    assert sum(lang.colour_words.values()) == sum(lang.shape_words.values()) == 200
    assert {"violet", "lilac", "turquoise", "teal", "tin", "tube"} <= set(lang.colour_words) | set(
        lang.shape_words
    )
    first = words("touch-mixed-all", rp5, 0, "unseen")
    assert lang.colour_words[first.played["colour"]] >= 1


def touch_outcomes(rp5: RobotSpec, phrasing: str, solved: list[bool]) -> list[EpisodeOutcome]:
    """Episodes of touch-mixed on :data:`SEEDS`, their instructions the ones the seeds draw."""
    return [
        EpisodeOutcome(
            "touch-mixed",
            i,
            s,
            ok,
            10,
            0.0,
            words("touch-mixed", rp5, s, phrasing).instruction,
            failure="" if ok else "timeout",
        )
        for i, (s, ok) in enumerate(zip(SEEDS, solved, strict=True))
    ]


def report_of(episodes: list[EpisodeOutcome], variant: str, phrasing: str) -> EvalReport:
    facts = {"variants": [variant], "wall_s": 1.0, "startup_s": 0.0, "workers": 0}
    facts |= {"replacements": 0, "seeds": SEEDS[: len(episodes)], "phrasing": phrasing}
    return summarize("p", [ShardOutcome(None, episodes)], facts, 0)  # type: ignore[arg-type]


def test_the_report_carries_the_language_section_for_touch_only(rp5: RobotSpec) -> None:
    needed = colour_needed("touch-mixed", rp5)
    report = report_of(
        touch_outcomes(rp5, "unseen-colour", [not n for n in needed]),
        "touch-mixed",
        "unseen-colour",
    )
    report.language = suite_language(report.outcomes, rp5, report.phrasing)
    assert report.language is not None and report.language.episodes == 200
    solved = sum(not n for n in needed)  # the rest time out: they went for no object
    assert report.language.went_for_object == report.language.went_for_target == solved
    text = markdown(report)
    assert "## Language: success where a word is needed" in text
    colour = report.language.kind("colour")
    assert colour is not None
    assert f"| colour | {colour.episodes} | 0.0% |" in text
    assert "Words played: colour " in text
    again = EvalReport.from_json(report.to_json())
    assert again.language == report.language, "the JSON round trip keeps the section"

    meta = [
        EpisodeOutcome("metaworld/button-press", i, i, True, 10, 1.0, "press") for i in range(3)
    ]
    other = report_of(meta, "metaworld/button-press", "trained")
    assert suite_language(other.outcomes, rp5, other.phrasing) is None
    assert "## Language" not in markdown(other)


def test_a_family_without_words_has_no_section(rp5: RobotSpec) -> None:
    """Meta-World's instructions name the task, not objects: its family has no episode words
    (the default of :meth:`TaskFamily.episode_words`), so the section is absent."""
    metaworld = task_family("metaworld")
    assert metaworld.episode_words("button-press", rp5, 0, "trained") is None
    assert (
        language_baselines("metaworld/button-press", rp5, [0, 1], [True, False], "trained") is None
    )


def test_a_recorded_instruction_its_seed_does_not_draw_is_refused(rp5: RobotSpec) -> None:
    episodes = touch_outcomes(rp5, "trained", [True] * len(SEEDS))
    report = report_of(episodes, "touch-mixed", "trained")
    with pytest.raises(RuntimeError, match="touch-mixed seed 0: played"):
        suite_language(report.outcomes, rp5, "shuffled")


def test_the_benchmark_prints_and_keys_the_language_baselines(rp5: RobotSpec) -> None:
    from benchmarks import pretrained_vla as bench

    seeds = SEEDS[:60]
    rng = np.random.default_rng(0)
    modes = np.array(["wrong_object", "near_miss", "timeout"])
    results: dict[str, dict[str, tuple[np.ndarray, list[str]]]] = {}
    for t in bench.TYPES:
        results[t] = {}
        for label in bench.SUITES:
            hits = rng.random(60) < 0.6
            failures = ["" if hit else str(rng.choice(modes)) for hit in hits]
            results[t][label] = (hits, failures)
    language = bench.language_of(results, seeds, rp5)
    lines = bench.language_lines(language)
    assert len(lines) == 1 + len(bench.TYPES) * len(bench.SUITES)
    assert any("shuffled" in line and "vs chance 33.3%" in line for line in lines)
    nonce = language["default"]["nonce"]
    hits, failures = results["default"]["nonce"]
    assert nonce.went_for_object == sum(hits) + sum(f != "timeout" for f in failures if f)
    assert nonce.went_for_target == sum(hits) + failures.count("near_miss")
    assert any(
        "nonce" in line and f"went for an object in {nonce.went_for_object}," in line
        for line in lines
    )
    assert any("unseen-colour" in line and "vs ignore-colour 50.0%" in line for line in lines)
    keys = bench.language_keys(language)
    mine = language["pretrained"]["unseen-colour"].kind("colour")
    assert mine is not None
    assert keys["pretrained_unseen-colour_colour_needed"] == f"{mine.success_rate:.3f}"
    assert keys["p_pretrained_unseen-colour_ignore_colour"] == f"{mine.p_value:.3g}"
    assert keys["ignore_colour_baseline"] == "0.500" and keys["chance"] == "0.333"
    assert {"all_ignore_colour_baseline", "all_chance", "p_default_absent_chance"} <= set(keys)
    assert keys["default_nonce_chose_named"] == f"{bench.choice_share(nonce):.3f}"
    assert keys["default_nonce_choice_chance"] == "0.333"
    assert "pretrained_all-unseen-colour_colour_needed" in keys
