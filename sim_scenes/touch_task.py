"""The touch task family as the task registry (:mod:`sim_scenes.tasks`) sees it: the rp5 arm
touches the object an instruction names. The task itself is :mod:`sim_scenes.touch`; this module
only answers the registry's questions from it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from sim_scenes import touch_words
from sim_scenes.tasks import EpisodeSignal, EpisodeWords, FailureMode, TaskFamily
from sim_scenes.touch import (
    COLOURS,
    PHRASINGS,
    SHAPE_WORDS,
    TEMPLATES,
    SceneVariant,
    available_variants,
    get_variant,
    heldout_variants,
)

if TYPE_CHECKING:
    from robots.spec import RobotSpec
    from sim_scenes.expert import ScriptedExpert


NEAR_MISS_MARGIN = 0.03
"""m beyond the success radius that still counts as reaching the object (the objects are 5 cm
across: the tool centre point resting on one is about 3 cm from its centre)."""


class TouchTasks(TaskFamily):
    """``touch``: coloured objects on a table, "touch the <colour> <shape>"."""

    name = "touch"
    description = 'rp5 touches the object an instruction names ("touch the red cube")'
    robot = "rp5"
    backends = ("mujoco", "isaaclab")
    phrasings = PHRASINGS
    example_instruction = "touch the red cube"
    env_state_names = ("target.x", "target.y", "target.z")
    """The named object's centre (m, robot base frame)."""
    # Every touch episode ends solved or cut at its step limit, so each failure is a timeout in
    # the strict sense; what tells a team what to fix is *where the arm was*, from the closest
    # approaches of the tool centre point to the object centres. Execution failures are what
    # RL in simulation fixes quickly; grounding failures it fixes slowly.
    failure_modes = (
        FailureMode(
            "wrong_object",
            "wrong object",
            "came closer to another object than to the named one, within touching distance "
            "of it (grounding)",
            went_for="other",
        ),
        FailureMode(
            "near_miss",
            "near miss",
            "reached the named object, never inside the success radius (execution: "
            "precision, overshoot, not pressing on)",
            measure="closest_target",
            measure_label="closest",
            unit="cm",
            scale=100.0,
            went_for="target",
        ),
        FailureMode("timeout", "timeout", "away from every object when time ran out"),
    )
    episode_signals = MappingProxyType(
        {
            "closest_target": EpisodeSignal("tcp_target_distance", "min"),
            "closest_distractor": EpisodeSignal("tcp_distractor_distance", "min"),
            "final_target": EpisodeSignal("tcp_target_distance", "last"),
        }
    )
    """m: the tool centre point's closest approach to the named object's centre and to any
    other object's (inf: none), and its distance to the named one after the last step."""

    def variant_names(self, split: str | None = None) -> list[str]:
        return available_variants(split)

    def variant(self, name: str) -> SceneVariant:
        return get_variant(name)

    def with_overrides(
        self,
        variant: Any,
        success: Mapping[str, Any],
        reward: Mapping[str, Any],
        episode_steps: int | None,
    ) -> SceneVariant:
        """Any field of the success criterion and the reward terms, and the episode length."""
        return replace(
            variant,
            success=replace(variant.success, **success),
            reward=replace(variant.reward, **reward),
            episode_steps=episode_steps or variant.episode_steps,
        )

    def eval_variants(self, name: str) -> list[str]:
        """The variants held out for ``name`` (its generalisation), else ``name`` itself."""
        return heldout_variants(name) or [name]

    def pretrain_variants(self, target: str) -> list[str]:
        """Every training variant marked ``pretrain_by_default`` except ``target``."""
        return [
            name
            for name in self.variant_names("train")
            if get_variant(name).pretrain_by_default and name != target
        ]

    def describe(self, name: str) -> dict[str, str]:
        """Objects on the table, their colours and shapes, and the description."""
        v = get_variant(name)
        return {
            "objects": f"{v.num_objects[0]}-{v.num_objects[1]}",
            "colours": ", ".join(v.colours),
            "shapes": ", ".join(v.shapes),
            "description": v.description,
        }

    def instructions(self) -> list[str]:
        """Every template x colour x shape word (synonyms included)."""
        words = sorted({w for synonyms in SHAPE_WORDS.values() for w in synonyms})
        return [t.format(colour=c, shape=s) for t in TEMPLATES for c in COLOURS for s in words]

    def env_state(self, env: Any) -> np.ndarray:
        """The named object's centre, from the simulator's ground truth."""
        return np.asarray(env.privileged()["target_pos"], dtype=np.float32)

    def failure_mode(self, success: bool, signals: dict[str, float], task: Any) -> str:
        """``wrong_object`` if the arm came closer to another object than it ever came to the
        named one and within ``radius + NEAR_MISS_MARGIN`` of it; ``near_miss`` if it came
        that close to the named one; else ``timeout`` (nan: not reported)."""
        if success:
            return ""
        reach = task.success.radius + NEAR_MISS_MARGIN
        target = signals.get("closest_target", math.nan)
        distractor = signals.get("closest_distractor", math.nan)
        if distractor < target and distractor <= reach:
            return "wrong_object"
        if target <= reach:
            return "near_miss"
        return "timeout"

    def episode_words(
        self, variant: str, robot: RobotSpec, seed: int, phrasing: str
    ) -> EpisodeWords:
        """The seed's layout's instruction, the objects left per ignored colour or shape word
        and the words played (:mod:`sim_scenes.touch_words`)."""
        return touch_words.episode_words(get_variant(variant), robot, seed, phrasing)

    def expert(self, robot: RobotSpec) -> ScriptedExpert:
        """Damped-least-squares IK to the named object (:mod:`sim_scenes.expert`)."""
        from sim_scenes.expert import ScriptedExpert  # loads the robot's MuJoCo model

        return ScriptedExpert(robot)


TOUCH = TouchTasks()
