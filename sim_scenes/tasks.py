"""Tasks by name (``scene.variant``): the one place a task is chosen.

A task is what the robot must do: its scene variants (the distributions episodes are drawn
from, each ``train`` or ``heldout``), which of them measure a trained variant and which a base
is pretrained on, how instructions may be worded, the robot it runs on and the simulator
backends that can play it. Tasks come in families, each a :class:`TaskFamily` named in
:data:`TASKS` by its entry point, imported only when that family is used:

- ``touch`` (built in, the default): the rp5 arm touches the object an instruction names
  (:mod:`sim_scenes.touch`), on MuJoCo or Isaac Lab;
- ``metaworld``: Meta-World v3's tasks on its Sawyer (MT10 and each of its ten tasks,
  :mod:`sim_scenes.metaworld.tasks`), on the ``metaworld`` backend (its own environment).

A task's name is ``[FAMILY/]VARIANT``; a bare name is a touch variant, so ``touch-mixed`` and
``touch/touch-mixed`` are the same task and the shipped configs keep their names, dataset names
and hashes. Collection, evaluation, pretraining and the config's checks ask the family, never a
family's module directly. Adding a family is its module (a :class:`TaskFamily`) plus one line in
:data:`TASKS`.
"""

from __future__ import annotations

import abc
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, cast

from sim_scenes.errors import SceneError

if TYPE_CHECKING:
    import numpy as np

    from robots.spec import RobotSpec

DEFAULT_FAMILY = "touch"
"""The family of a task named without one (``touch-mixed``)."""

TASKS: dict[str, str] = {
    "touch": "sim_scenes.touch_task:TOUCH",
    "metaworld": "sim_scenes.metaworld.tasks:METAWORLD",
}
"""Task family name -> ``module:attribute`` of its :class:`TaskFamily`."""


class TaskVariant(Protocol):
    """What every family's variant (a frozen dataclass of the family's own) states, and all that
    code outside the family reads of it; the rest is for the family's own backends."""

    @property
    def name(self) -> str:
        """Its name within the family (``touch-mixed``, ``mt10``)."""

    @property
    def description(self) -> str:
        """One line for listings."""

    @property
    def split(self) -> str:
        """``train`` (collect and train on it) or ``heldout`` (evaluation only)."""

    @property
    def holdout_for(self) -> str | None:
        """For held-out variants: the training variant whose generalisation it measures."""

    @property
    def episode_steps(self) -> int:
        """Control steps before an episode is cut."""


@dataclass(frozen=True)
class EpisodeSignal:
    """A per-step value a backend reports in ``StepResult.info`` (float ``(N,)``), reduced over
    each episode as :func:`sim_scenes.episodes.play_episodes` plays it: what a family tells
    its failures apart by."""

    key: str
    """The ``info`` key (``tcp_target_distance``)."""
    reduce: str
    """``min``, ``max`` (over the episode's steps; a nan step makes it nan: not reported) or
    ``last`` (after its last step)."""

    def __post_init__(self) -> None:
        if self.reduce not in ("min", "max", "last"):
            raise ValueError(f"{self.key}: unknown reduction {self.reduce!r}: min, max or last")


@dataclass(frozen=True)
class FailureMode:
    """One way an episode of a family's tasks fails, as evaluation reports count them."""

    name: str
    """Key in reports (``near_miss``)."""
    label: str
    """Column heading (``near miss``)."""
    means: str
    """What it says, in a few words, for the report's legend."""
    measure: str = ""
    """An :attr:`TaskFamily.episode_signals` name whose median and maximum over this mode's
    episodes reports add (``closest_target``); empty for none."""
    measure_label: str = ""
    """Its heading (``closest``)."""
    unit: str = ""
    """The unit reports show it in (``cm``)."""
    scale: float = 1.0
    """Signal value x scale = value in :attr:`unit` (100 for m -> cm)."""
    went_for: str = ""
    """The object the robot went for in an episode failing this way: ``target`` (the one the
    instruction names), ``other`` (another), or empty (none, or not a task about objects).
    Language reports compare the target's share of these choices with chance."""


WORD_KINDS: tuple[str, ...] = ("colour", "shape", "both")
"""The kinds of instruction word :class:`EpisodeWords` counts candidates for, in report order:
the colour word, the shape word, and ``both`` (every word: a policy that reads nothing)."""


@dataclass(frozen=True)
class EpisodeWords:
    """What the words of one episode's instruction are worth in its scene
    (:meth:`TaskFamily.episode_words`): a policy that ignores a kind of word can still pick the
    target, by chance, among the objects that word would have ruled out."""

    instruction: str
    """The instruction the episode plays (as its seed draws it in the phrasing)."""
    candidates: Mapping[str, int]
    """Word kind (:data:`WORD_KINDS`) -> the number of objects left as candidates for the
    target if a policy ignores that kind of word, the target included (>= 1; 1: the word is
    not needed). ``both`` is every object on the table (a policy that reads nothing) and is
    always present; a kind the family's instructions lack may be left out (not needed)."""
    played: Mapping[str, str]
    """Word kind -> the word the instruction used for it (``{"colour": "crimson", "shape":
    "box"}``); ``both`` never appears."""

    def __post_init__(self) -> None:
        unknown = (set(self.candidates) | set(self.played)) - set(WORD_KINDS)
        if unknown or "both" not in self.candidates or "both" in self.played:
            raise ValueError(
                f"episode words: kinds {sorted(self.candidates)} (played {sorted(self.played)}); "
                f"candidates need 'both', and every kind is one of {', '.join(WORD_KINDS)}"
            )
        if min(self.candidates.values()) < 1:
            raise ValueError(f"episode words: {dict(self.candidates)}: the target is a candidate")

    def needed(self, kind: str) -> bool:
        """Whether ignoring ``kind`` leaves more than the target (the word tells them apart)."""
        return self.candidates.get(kind, 1) > 1


class TaskFamily(abc.ABC):
    """A family of tasks sharing a robot, a vocabulary and simulator backends.

    Variant names are the family's own (``touch-mixed``), without the ``family/`` prefix.
    """

    name: str
    """Registry name (a key of :data:`TASKS`)."""
    description: str
    """One line for listings."""
    robot: str
    """The robot it runs on (a name ``robo-pipe robots`` lists)."""
    backends: tuple[str, ...]
    """``sim.backend`` values that can play it (keys of :data:`sim_scenes.config.BACKENDS`)."""
    phrasings: tuple[str, ...]
    """How its instructions may be worded (``trained`` first; others are for evaluation)."""
    example_instruction: str
    """One instruction of its training variants: what a robot's latency gate and health check
    give a policy (``instruction`` of a device config) when nothing else is asked."""
    env_state_names: tuple[str, ...]
    """The components of a dataset frame's ``observation.environment_state`` (privileged scene
    state recorded beside what the robot sees: :meth:`env_state`). The first two are the
    auxiliary target a policy learns to predict from its images while it learns to act (the
    (x, y) of what the instruction is about, m: touch's named object, a Meta-World task's
    goal), whatever the family: fine-tuning reads them by position."""
    failure_modes: tuple[FailureMode, ...]
    """Why its episodes fail, as :meth:`failure_mode` names them (the last is the catch-all)."""
    episode_signals: Mapping[str, EpisodeSignal]
    """Per-episode values evaluation records (by name) for :meth:`failure_mode`."""

    @abc.abstractmethod
    def variant_names(self, split: str | None = None) -> list[str]:
        """Its variants, sorted, optionally only those of one split (``train``/``heldout``)."""

    @abc.abstractmethod
    def variant(self, name: str) -> TaskVariant:
        """The variant ``name``; raises :class:`SceneError` listing the valid ones."""

    def with_overrides(
        self,
        variant: TaskVariant,
        success: Mapping[str, Any],
        reward: Mapping[str, Any],
        episode_steps: int | None,
    ) -> TaskVariant:
        """``variant`` as a scene config overrides it (``scene.success``, ``scene.reward``,
        ``scene.episode_steps``: the fields set). This default takes an episode length only; a
        family whose success or reward a config may change says how.

        Raises:
            SceneError: an override the family cannot apply (the message names the field).
        """
        for field_name, values in (("success", success), ("reward", reward)):
            if values:
                raise SceneError(
                    f"scene.{field_name}: the {self.name} tasks keep their own {field_name} "
                    f"({', '.join(values)} cannot be set)"
                )
        if episode_steps is None:
            return variant
        overridden: TaskVariant = replace(cast(Any, variant), episode_steps=episode_steps)
        return overridden

    @abc.abstractmethod
    def eval_variants(self, name: str) -> list[str]:
        """The suite a policy trained on ``name`` is measured on by default."""

    @abc.abstractmethod
    def pretrain_variants(self, target: str) -> list[str]:
        """The variants a base for ``target`` is pretrained on by default (never ``target``)."""

    @abc.abstractmethod
    def describe(self, name: str) -> dict[str, str]:
        """The variant ``name`` in a few columns for listings (``robo-pipe scenes``):
        ``description`` and what sets it apart, by column name."""

    @abc.abstractmethod
    def instructions(self) -> list[str]:
        """Every instruction the family's training variants can give, in its trained
        phrasing: what a policy's own word-level tokenizer is trained on (a word no instruction
        in it uses is unknown to the policy, by design: unseen phrasings test exactly that)."""

    @abc.abstractmethod
    def env_state(self, env: Any) -> np.ndarray:
        """The privileged scene state of each of ``env``'s environments (a
        :class:`~sim_scenes.batched_env.BatchedEnv` of this family) at the frame about to be
        acted on, float ``(N, len(env_state_names))``: what collection records as
        ``observation.environment_state``."""

    @abc.abstractmethod
    def failure_mode(self, success: bool, signals: dict[str, float], task: Any) -> str:
        """Why an episode failed (a :attr:`failure_modes` name), ``""`` if it succeeded.

        ``signals``: its :attr:`episode_signals` (a backend that does not report one leaves
        it out); ``task``: the variant as simulated (``SceneConfig.task``, overrides applied).
        """

    @abc.abstractmethod
    def expert(self, robot: RobotSpec) -> Callable[..., np.ndarray]:
        """The scripted expert that demonstrates the task on ``robot``, an acting function
        (:data:`sim_scenes.episodes.ActFn`, not imported here: episodes' imports lead back to
        this module): ``(env, observation)`` -> actions ``(N, robot.action.dim)`` in robot
        units. It may read the simulator's ground truth: demonstrations only, never a policy."""

    def episode_words(
        self, variant: str, robot: RobotSpec, seed: int, phrasing: str
    ) -> EpisodeWords | None:
        """The words of ``seed``'s episode of ``variant`` (a name within the family) on
        ``robot`` in ``phrasing`` (one of :attr:`phrasings`), and which of them its scene
        needs: what evaluation's language section (:mod:`stages.evaluate.language`) weighs
        success against. This default is None: a family whose instructions do not name objects
        by words (Meta-World's name the task) has no such section.

        A family that has it raises :class:`SceneError` for an unknown variant or phrasing
        (the message lists the valid ones).
        """
        return None


def split_task_name(name: str) -> tuple[str, str]:
    """``family/variant`` -> ``(family, variant)``; a bare name is the default family's."""
    family, slash, variant = name.rpartition("/")
    return (family, variant) if slash else (DEFAULT_FAMILY, name)


@cache
def task_family(name: str) -> TaskFamily:
    """The family ``name``; unknown names list the valid choices."""
    if name not in TASKS:
        raise SceneError(f"unknown task family {name!r}; valid choices: {', '.join(TASKS)}")
    family: TaskFamily = pkgutil.resolve_name(TASKS[name])
    return family


def resolve_task(name: str) -> tuple[TaskFamily, str]:
    """The family of the task ``name`` and the variant's name within it.

    Raises:
        SceneError: an unknown family or variant (the message lists the valid choices).
    """
    family_name, variant = split_task_name(name)
    family = task_family(family_name)
    if variant not in family.variant_names():
        raise SceneError(f"unknown task {name!r}; valid choices: {', '.join(available_tasks())}")
    return family, variant


def task_name(family: TaskFamily, variant: str) -> str:
    """The name configs use for ``variant`` of ``family`` (bare for the default family)."""
    return variant if family.name == DEFAULT_FAMILY else f"{family.name}/{variant}"


def available_tasks(split: str | None = None) -> list[str]:
    """Every task's name, optionally only the variants of one split."""
    return [
        task_name(family, variant)
        for family in map(task_family, TASKS)
        for variant in family.variant_names(split)
    ]
