"""The evaluation report's language section: what reading the instruction's words was worth.

A success rate on, say, unseen colour words says little by itself: where the colour word is
needed (the scene holds k > 1 objects of the target's shape), a policy that ignores the word
still touches the target 1 time in k by picking any of them. So, per word kind
(:data:`sim_scenes.tasks.WORD_KINDS`: ``colour``, ``shape``, ``both``), over the seeds where the
kind is needed, as the task family counts each seed's candidates
(:meth:`sim_scenes.tasks.TaskFamily.episode_words`):

- success, with its 95% Wilson interval;
- the baseline of a policy that ignores that word: the mean over those seeds of
  1/candidates, an upper bound (a policy that always touches one of the candidates at random);
- the exact one-sided p-value that the successes exceed it, with each seed's success chance
  1/candidates (:func:`stages.statistics.poisson_binomial_tail`).

Then *chance*, the success of a policy that reads nothing (the mean of 1/objects), which the
corrupted controls (``evaluate.phrasing: nonce``, ``shuffled`` or ``absent``) are compared
with, and the colour and shape words played, counted. A policy led astray by a corrupted
instruction often goes for no object at all, which takes its success *below* chance without
saying whether the instruction still pointed it at the target; so, where the episodes' failure
modes are given, the section also counts the episodes in which the robot went for an object
(the family's :attr:`~sim_scenes.tasks.FailureMode.went_for`: touched it, or came within
reach of it) and the named object's share of them, against chance among those episodes.
Only task families whose instructions name objects by words (touch) have the section; for the
others (``episode_words`` None) it is absent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from robo_pipe.records import Record
from robots.spec import RobotSpec
from sim_scenes.tasks import WORD_KINDS, EpisodeWords, TaskFamily, resolve_task
from stages.statistics import poisson_binomial_tail, wilson_interval

PHRASING_LINES = {
    "trained": "Instructions in the **trained** phrasings (those the training data uses).",
    "unseen": "Instructions in the **unseen** phrasings: templates and colour and shape words "
    "no training instruction contains (`evaluate.phrasing: unseen`); not comparable with an "
    "evaluation on the trained phrasings.",
    "unseen-template": "Instructions in **unseen templates** with the trained colour and shape "
    "words (`evaluate.phrasing: unseen-template`).",
    "unseen-colour": "Instructions naming the colour with **unseen colour words**, in trained "
    "templates with trained shape words (`evaluate.phrasing: unseen-colour`).",
    "unseen-shape": "Instructions naming the shape with **unseen shape words**, in trained "
    "templates with trained colour words (`evaluate.phrasing: unseen-shape`).",
    "nonce": "A corrupted control: trained templates whose colour and shape are **nonce** "
    'pseudowords (`evaluate.phrasing: nonce`, "touch the dax blicket"); the instruction '
    "names nothing, so a policy that reads it is at chance.",
    "shuffled": "A corrupted control: the trained instruction's words **shuffled** "
    "(`evaluate.phrasing: shuffled`); a policy that needs their order falls to chance, one "
    "that matches words as a bag does not.",
    "absent": "A corrupted control: instructions naming a colour and shape **absent** from the "
    "scene (`evaluate.phrasing: absent`); success is still touching the drawn target, so a "
    "policy led by the instruction goes to what shares its words: at or below chance.",
}
"""The report's line on how its instructions were worded, by ``evaluate.phrasing``."""
CONTROLS = {
    "nonce": "the policy finds the target without reading its instruction",
    "shuffled": "the policy does not need the words' order (it matches them as a bag), or "
    "finds the target without them",
    "absent": "the policy found the target without what the instruction says",
}
"""The corrupted phrasings, compared with chance, and what success well above it means."""


@dataclass
class WordNeed(Record):
    """Success where one word kind is needed, against a policy that ignores it."""

    word: str
    """``colour``, ``shape`` or ``both`` (:data:`sim_scenes.tasks.WORD_KINDS`)."""
    episodes: int
    """Episodes whose scene needs it (ignoring it leaves more than one candidate)."""
    successes: int
    success_rate: float
    ci95: tuple[float, float]
    """95% Wilson interval of ``success_rate``."""
    ignore_baseline: float
    """Success of a policy that ignores the word: mean over these episodes of 1/candidates (an
    upper bound: it always touches one of the candidates)."""
    p_value: float
    """One-sided exact p-value of ``successes`` or more at that baseline (Poisson-binomial,
    1/candidates per episode): small means the word was read."""


@dataclass
class LanguageBaselines(Record):
    """The language section of an evaluation (JSON-serialisable)."""

    phrasing: str
    episodes: int
    successes: int
    chance: float
    """Success of a policy that reads nothing: mean over the episodes of 1/objects."""
    chance_p_value: float
    """One-sided exact p-value of ``successes`` or more at chance (the controls' test: small
    means the policy found the target without what the instruction says)."""
    needed: list[WordNeed]
    """One per word kind needed in at least one episode, in ``colour, shape, both`` order."""
    colour_words: dict[str, int]
    """Episodes per colour word played (``crimson``: 12)."""
    shape_words: dict[str, int]
    """Episodes per shape word played."""
    went_for_object: int | None = None
    """Episodes in which the robot went for an object (touched one, or came within reach of
    one, as the family's failure modes say); None where failure modes were not given."""
    went_for_target: int | None = None
    """Of those, the episodes in which it went for the named object."""
    choice_chance: float | None = None
    """The named object's share of those episodes at chance: mean over them of 1/objects."""
    choice_p_value: float | None = None
    """One-sided exact p-value of ``went_for_target`` or more at ``choice_chance``."""

    def kind(self, word: str) -> WordNeed | None:
        """The row of word kind ``word``; None where no episode needed it."""
        return next((n for n in self.needed if n.word == word), None)


def language_baselines(
    variant: str,
    robot: RobotSpec,
    seeds: Sequence[int],
    success: Sequence[bool],
    phrasing: str,
    failures: Sequence[str] | None = None,
) -> LanguageBaselines | None:
    """The language section of episodes of one variant (a task name), played on ``seeds``
    with ``success`` (bool per seed) in ``phrasing``; None for a family whose instructions
    do not name objects by words (or no episodes). ``failures``: each episode's failure mode
    (:meth:`sim_scenes.tasks.TaskFamily.failure_mode`, empty on success), for the objects
    the robot went for; None leaves them out."""
    words = _words(variant, robot, seeds, phrasing)
    if words is None or not words:
        return None
    went = None
    if failures is not None:
        family = resolve_task(variant)[0]
        went = [_went_for(family, ok, f) for ok, f in zip(success, failures, strict=True)]
    return _baselines(words, list(success), phrasing, went)


def suite_language(
    outcomes: Sequence[Mapping[str, Any]], robot: RobotSpec, phrasing: str
) -> LanguageBaselines | None:
    """The language section of an evaluation's per-episode ``outcomes``
    (:attr:`stages.evaluate.report.EvalReport.outcomes`: variant, seed, success, instruction)
    over all its variants whose family has words (touch); None if none has.

    Raises:
        RuntimeError: an episode's recorded instruction is not the one its seed draws (the
            baselines would be of other scenes).
    """
    words: list[EpisodeWords] = []
    success: list[bool] = []
    went: list[str] = []
    for variant in dict.fromkeys(o["variant"] for o in outcomes):
        mine = [o for o in outcomes if o["variant"] == variant]
        drawn = _words(variant, robot, [int(o["seed"]) for o in mine], phrasing)
        if drawn is None:
            continue
        family = resolve_task(variant)[0]
        for episode, o in zip(drawn, mine, strict=True):
            if episode.instruction != o["instruction"]:
                raise RuntimeError(
                    f"{variant} seed {o['seed']}: played {o['instruction']!r}, but the seed "
                    f"draws {episode.instruction!r} in the {phrasing} phrasing"
                )
        words += drawn
        success += [bool(o["success"]) for o in mine]
        went += [_went_for(family, bool(o["success"]), o.get("failure", "")) for o in mine]
    return _baselines(words, success, phrasing, went) if words else None


def _went_for(family: TaskFamily, success: bool, failure: str) -> str:
    """The object an episode went for: ``target`` on success, else its failure mode's
    :attr:`~sim_scenes.tasks.FailureMode.went_for` (empty: none)."""
    if success:
        return "target"
    return next((m.went_for for m in family.failure_modes if m.name == failure), "")


def _words(
    variant: str, robot: RobotSpec, seeds: Sequence[int], phrasing: str
) -> list[EpisodeWords] | None:
    """The words of the episodes ``seeds`` draw on the task ``variant``; None if its family's
    instructions do not name objects by words."""
    family, name = resolve_task(variant)
    drawn = [family.episode_words(name, robot, int(s), phrasing) for s in seeds]
    words = [episode for episode in drawn if episode is not None]
    return words if len(words) == len(drawn) else None


def _baselines(
    words: list[EpisodeWords], success: list[bool], phrasing: str, went: list[str] | None
) -> LanguageBaselines:
    """The section from each episode's words, success and the object it went for (``target``,
    ``other``, empty; None: not known), in the same order."""
    if len(words) != len(success):
        raise ValueError(f"{len(words)} episodes' words but {len(success)} outcomes")
    needed = []
    for kind in WORD_KINDS:
        picked = [i for i, episode in enumerate(words) if episode.needed(kind)]
        if not picked:
            continue
        wins = sum(success[i] for i in picked)
        chances = [1.0 / words[i].candidates[kind] for i in picked]
        needed.append(
            WordNeed(
                kind,
                len(picked),
                wins,
                wins / len(picked),
                wilson_interval(wins, len(picked)),
                sum(chances) / len(chances),
                poisson_binomial_tail(chances, wins),
            )
        )
    chances = [1.0 / episode.candidates["both"] for episode in words]
    language = LanguageBaselines(
        phrasing=phrasing,
        episodes=len(success),
        successes=sum(success),
        chance=sum(chances) / len(chances),
        chance_p_value=poisson_binomial_tail(chances, sum(success)),
        needed=needed,
        colour_words=_played(words, "colour"),
        shape_words=_played(words, "shape"),
    )
    if went is not None:
        chose = [i for i, w in enumerate(went) if w]
        hits = sum(went[i] == "target" for i in chose)
        odds = [chances[i] for i in chose]
        language.went_for_object, language.went_for_target = len(chose), hits
        language.choice_chance = sum(odds) / len(odds) if odds else float("nan")
        language.choice_p_value = poisson_binomial_tail(odds, hits)
    return language


def _played(words: list[EpisodeWords], kind: str) -> dict[str, int]:
    """Episodes per word of ``kind`` played, by word (those that played one)."""
    return dict(sorted(Counter(e.played[kind] for e in words if kind in e.played).items()))


_LABELS = {"colour": "colour", "shape": "shape", "both": "both (reads nothing)"}


def language_markdown(language: LanguageBaselines) -> list[str]:
    """The report's "Language" section: a row per word kind needed, chance, the words."""
    lines = [
        "",
        "## Language: success where a word is needed",
        "",
        "Where ignoring a word of the instruction leaves k > 1 objects (the target among them), "
        "a policy that ignores it succeeds at most 1 time in k; success above that baseline "
        "is evidence that the word was read (one-sided exact p-value, Poisson-binomial).",
        "",
        "| word ignored | episodes needing it | success | 95% CI | baseline ignoring it | p |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for n in language.needed:
        lines.append(
            f"| {_LABELS[n.word]} | {n.episodes} | {n.success_rate:.1%} | {n.ci95[0]:.1%}–"
            f"{n.ci95[1]:.1%} | {n.ignore_baseline:.1%} | {n.p_value:.3g} |"
        )
    never = [k for k in WORD_KINDS if language.kind(k) is None]
    if never:
        lines += ["", f"Never needed in these scenes: {', '.join(never)}."]
    rate = language.successes / language.episodes
    lines += [
        "",
        f"Chance (a policy that reads nothing, 1/objects per episode): {language.chance:.1%}; "
        f"success {rate:.1%} over {language.episodes} episodes (p = "
        f"{language.chance_p_value:.3g} of that much at chance).",
    ]
    if language.went_for_object is not None and language.went_for_target is not None:
        chose = language.went_for_object
        share = language.went_for_target / chose if chose else float("nan")
        lines.append(
            f"The robot went for an object (touched it, or came within reach) in {chose} of "
            f"{language.episodes} episodes; for the named one in {share:.1%} of them, against "
            f"{language.choice_chance:.1%} at chance (p = {language.choice_p_value:.3g})."
        )
    if language.phrasing in CONTROLS:
        lines.append(
            f"This is a corrupted control (`{language.phrasing}`): success well above chance "
            f"means {CONTROLS[language.phrasing]}; going for no object takes success below "
            "chance, so the named object's share of the objects gone for is the test."
        )
    lines += [
        "",
        "Words played: colour " + _counts(language.colour_words) + "; shape "
        f"{_counts(language.shape_words)}.",
    ]
    return lines


def _counts(words: dict[str, int]) -> str:
    return ", ".join(f"{w} {n}" for w, n in words.items())
