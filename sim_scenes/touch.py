"""The language-conditioned tabletop task: "touch the <colour> <shape>".

A few coloured objects lie at random positions on the table in front of the arm; the instruction
names one of them by colour *and* shape, and distractors may share either, so a policy has to
look (where is it?) and read (which one?) to succeed.

This module is the task alone, the same on every simulator backend: its vocabulary (colours,
shapes, instruction templates), its scene variants, the layout of an episode, and when an
episode is solved and what it pays. Everything random about an episode is drawn from its seed
by :func:`sample_layout`, so a seed is a complete, reproducible description of a scene; the
seeds themselves come from :mod:`sim_scenes.seeds`. Each backend builds the scene its own way
(MuJoCo: :mod:`sim_scenes.mujoco.touch_scene`; Isaac Lab: :mod:`sim_scenes.isaaclab.touch_env`).

Units: metres, radians, seconds; positions are in the robot base frame (z up, table top at 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import numpy as np

from robots.spec import RobotSpec
from sim_scenes.errors import SceneError
from sim_scenes.rewards import RewardTerms
from sim_scenes.touch_controls import absent_pair, nonce_words, shuffled

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.12, 0.10),
    "green": (0.12, 0.70, 0.18),
    "blue": (0.10, 0.25, 0.90),
    "yellow": (0.95, 0.85, 0.10),
    "purple": (0.58, 0.16, 0.78),
    "cyan": (0.10, 0.80, 0.85),
}
SHAPES: tuple[str, ...] = ("cube", "ball", "cylinder")
SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "cube": ("cube", "block"),
    "ball": ("ball", "sphere"),
    "cylinder": ("cylinder", "can"),
}
OBJECT_HALF_HEIGHT = 0.025
"""Every shape rests with its centre 2.5 cm above the table."""

TEMPLATES: tuple[str, ...] = (
    "touch the {colour} {shape}",
    "tap the {colour} {shape}",
    "reach for the {colour} {shape}",
    "put the gripper on the {colour} {shape}",
    "move to the {colour} {shape}",
    "go touch the {colour} {shape}",
)

# The unseen phrasings: an evaluation of language generalisation (``evaluate.phrasing:
# unseen``). No template or word here appears in any training instruction (not even "the"),
# so a policy that solves them understood words it never saw, rather than matching ones it did.
UNSEEN_TEMPLATES: tuple[str, ...] = (
    "press that {colour} {shape}",
    "point at this {colour} {shape}",
    "could you poke that {colour} {shape}",
    "find that {colour} {shape} and press it",
    "please contact this {colour} {shape}",
    "your target is that {colour} {shape}",
    "nudge this {colour} {shape}",
)
COLOUR_SYNONYMS: dict[str, tuple[str, ...]] = {
    "red": ("crimson", "scarlet"),
    "green": ("emerald", "lime"),
    "blue": ("azure", "navy"),
    "yellow": ("golden", "lemon"),
    "purple": ("violet", "lilac"),
    "cyan": ("turquoise", "teal"),
}
"""Each of :data:`COLOURS`, in words the training instructions never use."""
SHAPE_SYNONYMS: dict[str, tuple[str, ...]] = {
    "cube": ("box", "cuboid"),
    "ball": ("orb", "globe"),
    "cylinder": ("tin", "tube"),
}
"""Each of :data:`SHAPES`, in words the training instructions never use (unlike
:data:`SHAPE_WORDS`, which the training instructions draw from)."""

Phrasing = Literal[
    "trained",
    "unseen",
    "unseen-template",
    "unseen-colour",
    "unseen-shape",
    "nonce",
    "absent",
    "shuffled",
]
"""How instructions are worded: ``trained`` (:data:`TEMPLATES`, the colour names,
:data:`SHAPE_WORDS`: every training instruction) or ``unseen`` (:data:`UNSEEN_TEMPLATES`,
:data:`COLOUR_SYNONYMS`, :data:`SHAPE_SYNONYMS`: evaluation only). The three partial ones
change one part of the trained wording and keep the other two, to tell which novelty a policy
fails on: ``unseen-template`` (an unseen template, the trained colour and shape words),
``unseen-colour`` (a colour synonym), ``unseen-shape`` (a shape synonym). The corrupted
controls ``nonce``, ``absent`` and ``shuffled`` (:mod:`sim_scenes.touch_controls`) are
evaluation only; success still means touching the drawn target."""
PHRASINGS: tuple[str, ...] = get_args(Phrasing)
_UNSEEN_STREAM = 1
"""Spawn key of the unseen words' random stream: drawing them leaves the scene's draws alone."""


@dataclass(frozen=True)
class SuccessCriterion:
    """When an episode counts as solved.

    Success is the tool centre point within ``radius`` of the named object's centre for
    ``hold_steps`` consecutive control steps; the episode then terminates.
    """

    radius: float = 0.045
    """m, tcp to object centre."""
    hold_steps: int = 2
    """Consecutive control steps inside ``radius``."""


@dataclass(frozen=True)
class SceneVariant:
    """A distribution over scenes of the touch task.

    Variants with ``split="heldout"`` are reserved for evaluation: data collection refuses them.
    """

    name: str
    description: str
    colours: tuple[str, ...]
    shapes: tuple[str, ...]
    num_objects: tuple[int, int]
    """Inclusive range of objects on the table (target included)."""
    split: str = "train"
    """``train`` (collect and train on it) or ``heldout`` (evaluation only)."""
    holdout_for: str | None = None
    """For held-out variants: the training variant whose generalisation it measures."""
    workspace_x: tuple[float, float] = (0.28, 0.50)
    """Range of object centres along x, m (away from the robot)."""
    workspace_y: tuple[float, float] = (-0.18, 0.18)
    """Range of object centres along y, m."""
    min_separation: float = 0.08
    """Smallest distance between object centres, m."""
    light_jitter: float = 0.3
    """Key light position jitter, ± m per axis."""
    light_intensity: tuple[float, float] = (0.55, 0.9)
    """Key light diffuse intensity range."""
    camera_jitter: float = 0.01
    """Scene camera position jitter, ± m per axis."""
    arm_jitter: float = 0.05
    """Initial arm joint jitter around home, ± rad."""
    colour_twin: bool = False
    """Every scene holds a distractor of the target's colour in another shape, so the
    instruction's shape word matters (single-shape variants never need it)."""
    episode_steps: int = 50
    """Control steps before truncation (5 s at 10 Hz)."""
    success: SuccessCriterion = field(default_factory=SuccessCriterion)
    reward: RewardTerms = field(default_factory=RewardTerms)
    pretrain_by_default: bool = True
    """In the task family a base is pretrained on when ``pretrain.variants`` is unset."""
    in_default_suite: bool = True
    """Held-out variants: played when ``holdout_for`` is evaluated without naming a suite
    (False: a probe played only when named, such as touch-mixed-all)."""


_ALL_COLOURS = tuple(COLOURS)
_BASE = ("red", "green", "blue", "yellow")

_MIXED = SceneVariant(
    "touch-mixed",
    "3 cubes and balls of 4 colours, always one of the target's colour in the other "
    "shape: colour and shape both matter",
    _BASE,
    ("cube", "ball"),
    (3, 3),
    colour_twin=True,
)

_SINGLE = SceneVariant(
    "touch-single",
    "1 cube or ball of 4 colours: reach it (an easier task)",
    _BASE,
    ("cube", "ball"),
    (1, 1),
    pretrain_by_default=False,
)


def _shifted(variant: SceneVariant) -> SceneVariant:
    """The held-out twin of ``variant``: the same task under stronger light and camera jitter."""
    return replace(
        variant,
        name=f"{variant.name}-shifted",
        description=f"held out: {variant.name} under stronger light and camera jitter",
        split="heldout",
        holdout_for=variant.name,
        light_jitter=0.6,
        light_intensity=(0.4, 1.0),
        camera_jitter=0.02,
    )


VARIANTS: dict[str, SceneVariant] = {
    v.name: v
    for v in (
        SceneVariant("touch-cubes", "3 cubes of 6 colours", _ALL_COLOURS, ("cube",), (3, 3)),
        SceneVariant("touch-balls", "3 balls of 6 colours", _ALL_COLOURS, ("ball",), (3, 3)),
        SceneVariant(
            "touch-cylinders", "3 cylinders of 6 colours", _ALL_COLOURS, ("cylinder",), (3, 3)
        ),
        _MIXED,
        # An easier task, for a quick start: one object, nothing to tell apart; not in the
        # demo's pretraining family.
        _SINGLE,
        _shifted(_SINGLE),
        # The held-out variants are touch-mixed with one thing changed.
        replace(
            _MIXED,
            name="touch-mixed-clutter",
            description="held out: touch-mixed with a fourth object",
            num_objects=(4, 4),
            split="heldout",
            holdout_for="touch-mixed",
        ),
        _shifted(_MIXED),
        # Every colour and shape, so that every synonym is played (touch-mixed never shows
        # purple, cyan or a cylinder); named explicitly, not in touch-mixed's default suite.
        replace(
            _MIXED,
            name="touch-mixed-all",
            description="held out: touch-mixed with all 6 colours and 3 shapes",
            colours=_ALL_COLOURS,
            shapes=SHAPES,
            split="heldout",
            holdout_for="touch-mixed",
            in_default_suite=False,
        ),
    )
}


def available_variants(split: str | None = None) -> list[str]:
    """Variant names, optionally only those of one split (``train`` or ``heldout``)."""
    return sorted(n for n, v in VARIANTS.items() if split is None or v.split == split)


def get_variant(name: str) -> SceneVariant:
    """Look up a variant; unknown names list the valid choices."""
    if name not in VARIANTS:
        raise SceneError(
            f"unknown scene variant {name!r}; valid choices: {', '.join(available_variants())}"
        )
    return VARIANTS[name]


def touch_variant(variant: object) -> SceneVariant:
    """``variant`` (any family's, as :meth:`sim_scenes.config.SceneConfig.task` gives it) as a
    touch variant; another family's is refused by name (a backend that only plays touch)."""
    if not isinstance(variant, SceneVariant):
        raise SceneError(
            f"{getattr(variant, 'name', variant)!r} is not a touch task: this backend plays the "
            "touch tasks only"
        )
    return variant


def heldout_variants(name: str) -> list[str]:
    """Held-out variants that measure generalisation of the training variant ``name`` (its
    default evaluation suite: those ``in_default_suite``)."""
    return sorted(n for n, v in VARIANTS.items() if v.holdout_for == name and v.in_default_suite)


@dataclass(frozen=True)
class PlacedObject:
    """One object of a layout: colour and shape names, centre (x, y) in m, yaw in rad."""

    colour: str
    shape: str
    xy: tuple[float, float]
    yaw: float


@dataclass(frozen=True)
class EpisodeLayout:
    """Everything random about one episode, drawn from ``seed``."""

    seed: int
    objects: tuple[PlacedObject, ...]
    target: int
    """Index into ``objects`` of the object the instruction names."""
    instruction: str
    arm_qpos: tuple[float, ...]
    """Initial arm joint positions, rad."""
    light_pos: tuple[float, float, float]
    light_intensity: float
    camera_offset: tuple[float, float, float]
    """Scene camera displacement from its nominal position, m."""
    colour_word: str = ""
    """The colour word the instruction plays (``crimson`` in an unseen phrasing)."""
    shape_word: str = ""
    """The shape word the instruction plays (``block``, ``orb``)."""


def sample_layout(
    variant: SceneVariant,
    robot: RobotSpec,
    seed: int,
    retarget: int = 0,
    phrasing: Phrasing = "trained",
) -> EpisodeLayout:
    """Draw a scene from ``variant`` deterministically from ``seed``.

    ``retarget`` > 0 keeps the scene but names the object ``retarget`` places after the drawn
    target: the same scene with another instruction (to show that the instruction matters).
    ``phrasing="unseen"`` keeps the scene and target too, and words the instruction with the
    unseen templates and synonyms (:data:`UNSEEN_TEMPLATES`), drawn from their own stream of
    ``seed``; so do the corrupted controls ``shuffled`` and ``absent`` (:data:`Phrasing`).
    """
    if phrasing not in PHRASINGS:
        raise SceneError(f"unknown phrasing {phrasing!r}; valid choices: {', '.join(PHRASINGS)}")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(variant.num_objects[0], variant.num_objects[1] + 1))
    pairs = [(c, s) for c in variant.colours for s in variant.shapes]
    chosen = rng.choice(len(pairs), size=n, replace=False)
    positions: list[tuple[float, float]] = []
    while len(positions) < n:  # rejection sampling; the workspace fits 4 objects easily
        xy = (float(rng.uniform(*variant.workspace_x)), float(rng.uniform(*variant.workspace_y)))
        if all(math.dist(xy, p) >= variant.min_separation for p in positions):
            positions.append(xy)
    objects = tuple(
        PlacedObject(pairs[k][0], pairs[k][1], positions[i], float(rng.uniform(0, 2 * math.pi)))
        for i, k in enumerate(chosen)
    )
    target = int(rng.integers(n))
    if variant.colour_twin:
        objects = _with_colour_twin(objects, target, variant.shapes)
    target = (target + retarget) % n
    template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    words = SHAPE_WORDS[objects[target].shape]
    trained = (template, objects[target].colour, words[int(rng.integers(len(words)))])
    # The other phrasings' words come from their own streams, so the scene is the same.
    phrased = _phrased(trained, objects, target, variant, seed, phrasing)
    instruction = phrased[0].format(colour=phrased[1], shape=phrased[2])
    if phrasing == "shuffled":
        instruction = shuffled(instruction, seed)
    home = np.asarray(robot.authored.home_arm)
    arm = home + rng.uniform(-variant.arm_jitter, variant.arm_jitter, size=home.shape)
    lows = np.array([j.low for j in robot.arm])
    highs = np.array([j.high for j in robot.arm])
    arm = np.clip(arm, lows, highs)
    light = np.array([0.3, -0.4, 1.5]) + rng.uniform(-variant.light_jitter, variant.light_jitter, 3)
    return EpisodeLayout(
        seed=seed,
        objects=objects,
        target=target,
        instruction=instruction,
        arm_qpos=tuple(float(q) for q in arm),
        light_pos=(float(light[0]), float(light[1]), float(light[2])),
        light_intensity=float(rng.uniform(*variant.light_intensity)),
        camera_offset=tuple(  # type: ignore[arg-type]
            float(v) for v in rng.uniform(-variant.camera_jitter, variant.camera_jitter, 3)
        ),
        colour_word=phrased[1],
        shape_word=phrased[2],
    )


def _with_colour_twin(
    objects: tuple[PlacedObject, ...], target: int, shapes: tuple[str, ...]
) -> tuple[PlacedObject, ...]:
    """Make the next object after the target its colour twin (same colour, another shape)
    unless one is already on the table."""
    colour = objects[target].colour
    if any(o.colour == colour for i, o in enumerate(objects) if i != target):
        return objects
    other_shape = next(s for s in shapes if s != objects[target].shape)
    twin = (target + 1) % len(objects)
    placed = objects[twin]
    return tuple(
        PlacedObject(colour, other_shape, placed.xy, placed.yaw) if i == twin else o
        for i, o in enumerate(objects)
    )


def _unseen_words(target: PlacedObject, seed: int) -> tuple[str, str, str]:
    """(template, colour word, shape word) naming ``target`` in the unseen phrasing, drawn
    from ``seed``'s own stream (the scene's stream is not touched)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_UNSEEN_STREAM,)))
    template = UNSEEN_TEMPLATES[int(rng.integers(len(UNSEEN_TEMPLATES)))]
    colours, shapes = COLOUR_SYNONYMS[target.colour], SHAPE_SYNONYMS[target.shape]
    return (
        template,
        colours[int(rng.integers(len(colours)))],
        shapes[int(rng.integers(len(shapes)))],
    )


def _phrased(
    trained: tuple[str, str, str],
    objects: tuple[PlacedObject, ...],
    target: int,
    variant: SceneVariant,
    seed: int,
    phrasing: Phrasing,
) -> tuple[str, str, str]:
    """The (template, colour word, shape word) ``phrasing`` words the instruction in, from the
    trained ones and the other phrasings' own draws."""
    if phrasing == "absent":
        return _absent_words(objects, variant, seed)
    if phrasing == "nonce":
        return (trained[0], *nonce_words(seed))
    unseen = _unseen_words(objects[target], seed)
    template, colour, shape = trained
    if phrasing in ("unseen", "unseen-template"):
        template = unseen[0]
    if phrasing in ("unseen", "unseen-colour"):
        colour = unseen[1]
    if phrasing in ("unseen", "unseen-shape"):
        shape = unseen[2]
    return template, colour, shape


def _absent_words(
    objects: tuple[PlacedObject, ...], variant: SceneVariant, seed: int
) -> tuple[str, str, str]:
    """(trained template, colour, trained shape word) naming a colour and shape that no object
    of the scene has: one of the variant's own pairs (words its training played), else of the
    whole vocabulary."""
    placed = {(o.colour, o.shape) for o in objects}
    pairs = [(c, s) for c in variant.colours for s in variant.shapes]
    if placed >= set(pairs):
        pairs = [(c, s) for c in COLOURS for s in SHAPES]
    (colour, shape), rng = absent_pair(placed, pairs, seed)
    words = SHAPE_WORDS[shape]
    template = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    return template, colour, words[int(rng.integers(len(words)))]
