"""The ``metaworld`` task family: Meta-World v3's tasks on its Sawyer, as the task registry
(:mod:`sim_scenes.tasks`) sees them.

Variants (``robo-pipe scenes``): ``mt10``, the MT10 benchmark's ten tasks, each episode one of
them; ``mt2``, two of them (reach and the top-down button press: the CI suite); and each MT10
task alone, by its Meta-World name without ``-v3`` (``metaworld/door-open``). An episode's seed
decides its task (a multi-task variant's) and its layout, drawn by Meta-World from its own
random reset space (:mod:`sim_scenes.metaworld.worker`); evaluation plays seeds collection never
does, so its layouts are new ones. A policy trained on a multi-task variant is measured on
each of its tasks alone: the report's per-task table. Success, reward and the scripted expert
are Meta-World's own. Nothing here imports Meta-World: it runs in its own environment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from sim_scenes.errors import SceneError
from sim_scenes.rewards import RewardTerms
from sim_scenes.tasks import EpisodeSignal, FailureMode, TaskFamily

if TYPE_CHECKING:
    from robots.spec import RobotSpec

MT10_TASKS = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
"""The MT10 benchmark's tasks (Meta-World's ``MT10_V3``), in its order."""

INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "reach-v3": ("reach the goal", "move the gripper to the goal", "reach for the goal point"),
    "push-v3": ("push the puck to the goal", "slide the puck to the goal", "push the puck"),
    "pick-place-v3": (
        "pick up the puck and place it at the goal",
        "pick the puck and put it on the goal",
        "grasp the puck and move it to the goal",
    ),
    "door-open-v3": ("open the door", "pull the door open", "swing the door open"),
    "drawer-open-v3": ("open the drawer", "pull the drawer open", "pull out the drawer"),
    "drawer-close-v3": ("close the drawer", "push the drawer closed", "shut the drawer"),
    "button-press-topdown-v3": (
        "press the button from the top",
        "push the button down",
        "press down on the button",
    ),
    "peg-insert-side-v3": (
        "insert the peg into the hole",
        "put the peg in the side hole",
        "push the peg into the hole",
    ),
    "window-open-v3": ("open the window", "slide the window open", "push the window open"),
    "window-close-v3": ("close the window", "slide the window closed", "shut the window"),
}
"""Each task's trained phrasings (an episode's seed picks one)."""

BASE_TASKS = (
    "button-press-v3",
    "coffee-button-v3",
    "faucet-open-v3",
    "handle-press-v3",
    "plate-slide-v3",
)
"""Meta-World tasks outside MT10 whose scripted experts solve them reliably: what a base for
MT10 is pretrained on (the Sawyer, its camera and its scenes, none of MT10's tasks)."""

INSTRUCTIONS.update(
    {
        "button-press-v3": ("press the button from the front", "push the button in"),
        "coffee-button-v3": ("press the coffee button", "push the coffee machine button"),
        "faucet-open-v3": ("open the faucet", "turn the faucet open"),
        "handle-press-v3": ("press the handle down", "push the handle down"),
        "plate-slide-v3": ("slide the plate to the goal", "push the plate into the goal"),
    }
)

UNSEEN_INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "reach-v3": ("could you get your hand over to that goal",),
    "push-v3": ("nudge that puck over onto its goal",),
    "pick-place-v3": ("lift that puck and set it down upon its goal",),
    "door-open-v3": ("please get that door opened",),
    "drawer-open-v3": ("please get that drawer opened",),
    "drawer-close-v3": ("please get that drawer closed",),
    "button-press-topdown-v3": ("please hit that button from above",),
    "peg-insert-side-v3": ("please slot that peg inside its hole",),
    "window-open-v3": ("please get that window opened",),
    "window-close-v3": ("please get that window closed",),
}
UNSEEN_INSTRUCTIONS.update(
    {
        "button-press-v3": ("please hit that button head on",),
        "coffee-button-v3": ("please hit that coffee button",),
        "faucet-open-v3": ("please get that faucet opened",),
        "handle-press-v3": ("please get that handle lowered",),
        "plate-slide-v3": ("please get that plate onto its goal",),
    }
)
"""Each task's unseen phrasings (evaluation only): the task's own nouns, in wording no trained
instruction uses."""

GOAL_IS_TARGET = frozenset({"reach-v3"})
"""Tasks about a point, not an object: their auxiliary target is the goal."""

REACH_M = 0.08
"""m: a hand this close to the task's object (its centre, as Meta-World's observation places
it) has reached it: the experts' hands come within 3-6 cm of a handle or button they work."""

MAX_EPISODE_STEPS = 500
"""Meta-World's own cap on an episode (``max_path_length``)."""
EPISODE_STEPS = 200
"""Control steps before an episode is cut (2.5 s at 80 Hz; Meta-World's own cap is
:data:`MAX_EPISODE_STEPS`): the scripted experts solve every MT10 task well inside it
(docs/benchmarks.md)."""


@dataclass(frozen=True)
class MetaWorldVariant:
    """A distribution over Meta-World episodes: which tasks, with what cap."""

    name: str
    description: str
    tasks: tuple[str, ...]
    """Meta-World task names (``reach-v3``); an episode's seed picks one."""
    split: str = "train"
    """Always ``train``: held-out evaluation is by seed (new layouts), not by variant."""
    holdout_for: str | None = None
    episode_steps: int = EPISODE_STEPS
    reward: RewardTerms | None = None
    """``None``: Meta-World's own reward (0-10 a step, paid while the task is near done);
    terms (a config's ``scene.reward``): robo-pipe's over the distance from the task's object
    (reach: the hand) to its goal. An episode here ends when it is solved, so Meta-World's own
    reward pays a learner for lingering short of success: RL sets terms."""

    def episode_task(self, seed: int) -> str:
        """The task an episode of ``seed`` plays."""
        return self.tasks[seed % len(self.tasks)]

    def instruction(self, seed: int, phrasing: str = "trained") -> str:
        """The instruction of the episode of ``seed``, worded as ``phrasing`` says."""
        task = self.episode_task(seed)
        if phrasing == "trained":
            choices = INSTRUCTIONS[task]
        elif phrasing == "unseen":
            choices = UNSEEN_INSTRUCTIONS[task]
        else:
            raise SceneError(f"the Meta-World tasks are worded trained or unseen, not {phrasing!r}")
        # seed // len(tasks): the task's own draw leaves every phrasing equally likely
        return choices[(seed // len(self.tasks)) % len(choices)]


def _short(task: str) -> str:
    return task.removesuffix("-v3")


VARIANTS: dict[str, MetaWorldVariant] = {
    "mt10": MetaWorldVariant(
        "mt10", "the MT10 benchmark: its ten tasks, one an episode", MT10_TASKS
    ),
    "mt2": MetaWorldVariant(
        "mt2",
        "reach and press the button from the top: two MT10 tasks, the CI suite",
        ("reach-v3", "button-press-topdown-v3"),
    ),
    **{
        _short(task): MetaWorldVariant(_short(task), f"MT10's {_short(task)} alone", (task,))
        for task in MT10_TASKS
    },
    **{
        _short(task): MetaWorldVariant(
            _short(task), f"{_short(task)} alone (outside MT10: a base's task)", (task,)
        )
        for task in BASE_TASKS
    },
}


class MetaWorldTasks(TaskFamily):
    """``metaworld``: Meta-World v3's tasks on its Sawyer, with its scripted experts."""

    name = "metaworld"
    description = "Meta-World v3's MT10 tasks on its Sawyer (the benchmark's own success)"
    robot = "sawyer"
    backends = ("metaworld",)
    phrasings = ("trained", "unseen")
    example_instruction = INSTRUCTIONS["reach-v3"][0]
    env_state_names = ("target.x", "target.y", "target.z", "goal.x", "goal.y", "goal.z")
    """The task's object (reach: its goal point) and where the task must end (Meta-World's goal:
    a point to reach, where the puck or a handle must arrive), m (Meta-World's world frame).
    The object comes first: the auxiliary target a policy learns to predict from its images is
    what only the images show (the goal is in the Sawyer's state, as MT10 observes it)."""
    failure_modes = (
        FailureMode(
            "never_reached",
            "never reached",
            f"the hand never came within {REACH_M * 100:.0f} cm of the task's object (reach: "
            "its goal point)",
            measure="closest_target",
            measure_label="closest",
            unit="cm",
            scale=100.0,
        ),
        FailureMode(
            "short_of_goal",
            "short of goal",
            "reached the object, never brought it to its goal by the task's own test (reach: "
            "came near the goal point, never close enough)",
            measure="closest_goal",
            measure_label="closest",
            unit="cm",
            scale=100.0,
        ),
    )
    episode_signals = MappingProxyType(
        {
            "closest_target": EpisodeSignal("hand_target_distance", "min"),
            "closest_goal": EpisodeSignal("target_goal_distance", "min"),
        }
    )
    """m: the hand's closest approach to the task's object, and the object's to its goal (a task
    about a point, reach: the hand's to it)."""

    def variant_names(self, split: str | None = None) -> list[str]:
        return sorted(n for n, v in VARIANTS.items() if split in (None, v.split))

    def variant(self, name: str) -> MetaWorldVariant:
        if name not in VARIANTS:
            raise SceneError(
                f"unknown Meta-World variant {name!r}; valid choices: {', '.join(sorted(VARIANTS))}"
            )
        return VARIANTS[name]

    def with_overrides(
        self,
        variant: Any,
        success: Mapping[str, Any],
        reward: Mapping[str, Any],
        episode_steps: int | None,
    ) -> MetaWorldVariant:
        """An episode length up to Meta-World's own cap; reward terms
        (:attr:`MetaWorldVariant.reward`: unset ones take
        :class:`~sim_scenes.rewards.RewardTerms`' defaults); success is Meta-World's."""
        if episode_steps is not None and episode_steps > MAX_EPISODE_STEPS:
            raise SceneError(
                f"scene.episode_steps: {episode_steps} is over Meta-World's cap of "
                f"{MAX_EPISODE_STEPS} steps"
            )
        if reward:
            variant = replace(variant, reward=RewardTerms(**reward))
        overridden: MetaWorldVariant = super().with_overrides(variant, success, {}, episode_steps)  # type: ignore[assignment]
        return overridden

    def eval_variants(self, name: str) -> list[str]:
        """Each of the variant's tasks alone (a per-task table)."""
        return [_short(task) for task in VARIANTS[name].tasks]

    def pretrain_variants(self, target: str) -> list[str]:
        """:data:`BASE_TASKS` and the MT10 tasks the target does not play, each alone (for
        ``mt10``: the base tasks only)."""
        own = set(VARIANTS[target].tasks)
        return [_short(task) for task in (*BASE_TASKS, *MT10_TASKS) if task not in own]

    def describe(self, name: str) -> dict[str, str]:
        v = VARIANTS[name]
        return {"tasks": ", ".join(map(_short, v.tasks)), "description": v.description}

    def instructions(self) -> list[str]:
        return sorted({text for texts in INSTRUCTIONS.values() for text in texts})

    def env_state(self, env: Any) -> np.ndarray:
        truth = env.privileged()
        return np.concatenate([truth["target_pos"], truth["goal_pos"]], axis=1).astype(np.float32)

    def failure_mode(self, success: bool, signals: dict[str, float], task: Any) -> str:
        """``never_reached`` if the hand never came within :data:`REACH_M` of the object, else
        ``short_of_goal`` (a signal not reported is nan: that test does not fire)."""
        if success:
            return ""
        if signals.get("closest_target", math.nan) > REACH_M:
            return "never_reached"
        return "short_of_goal"

    def expert(self, robot: RobotSpec) -> Any:
        """Meta-World's scripted expert for each episode's task (``metaworld.policies``),
        asked of the worker that plays it."""
        return lambda env, obs: env.expert_actions()


METAWORLD = MetaWorldTasks()
