"""Robot specifications: what a policy may command and what it observes, in physical units.

A robot is authored as a :class:`RobotDefinition` (names and constants in Python, geometry and
limits in MJCF). :func:`load_robot` compiles the MJCF, checks the two agree and returns a frozen
:class:`RobotSpec`. Joint and actuator limits are read from the MJCF, which stays their one
source of truth.

Each action component has a *kind* (:data:`ActionKind`), which is all that generic code (the
control loops, the gates, the delay model, an untrained policy's normaliser) knows of a robot's
action semantics:
    ``delta``     a change of one state component, relative to its *measured* value
                  (``state[state_index] += scale * action``), clipped to the action bounds;
    ``absolute``  a target value of one state component (``state[state_index] -> action``);
    ``effort``    a command no state component measures (a gripper's closing effort).

An MJCF robot (:func:`load_robot`), shape ``(action.dim,)`` = arm joints + 1:
    ``[0 : n_arm]``  joint position deltas in rad (``delta``), clipped to ``±max_joint_delta``
                     per control step;
    ``[n_arm]``      gripper opening target in m (distance between the fingers, ``absolute``).
Its observation state, shape ``(state_dim,)`` = arm joints + 1:
    joint positions in rad, then the measured gripper opening in m.
"""

from __future__ import annotations

import math
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from robo_pipe.errors import RoboPipeError

if TYPE_CHECKING:  # MuJoCo loads where a model is compiled: not for a CLI that checks a spec
    import mujoco


class RobotDefinitionError(RoboPipeError, ValueError):
    """A robot name, MJCF file or limit is invalid; the message names the file and the value."""


@dataclass(frozen=True)
class RobotDefinition:
    """A robot as authored: names of things in its MJCF plus the constants MJCF cannot hold."""

    name: str
    """Registry name, e.g. ``rp5``."""
    description: str
    """One line for ``robo-pipe`` listings."""
    mjcf: Path
    """MJCF file of the arm (and its work-cell cameras), no scene objects."""
    arm_joints: tuple[str, ...]
    """Actuated arm joints, base to tool; each needs a position actuator of the same name."""
    gripper_joints: tuple[str, ...]
    """Finger slide joints; all are driven to half the commanded opening."""
    tcp_site: str
    """Site at the tool centre point (between the fingertips)."""
    cameras: tuple[str, ...]
    """Cameras the robot carries or its cell provides (MJCF camera names)."""
    control_hz: float
    """Control rate in Hz: one action per ``1/control_hz`` seconds."""
    physics_timestep: float
    """Simulation timestep in s; ``1/control_hz`` must be a whole multiple of it."""
    home_arm: tuple[float, ...]
    """Home joint positions in rad, one per arm joint."""
    home_gripper: float
    """Home gripper opening in m."""
    max_joint_delta: float
    """Largest joint position change one action may command, rad per control step."""


@dataclass(frozen=True)
class JointSpec:
    """One actuated joint. ``low``/``high`` in rad (hinge) or m (slide), from the MJCF."""

    name: str
    low: float
    high: float


@dataclass(frozen=True)
class CameraSpec:
    """A camera by MJCF name; ``fovy_deg`` is its vertical field of view in degrees."""

    name: str
    fovy_deg: float


ActionKind = Literal["delta", "absolute", "effort"]
"""What an action component commands (see the module docstring)."""


@dataclass(frozen=True)
class ActionSpec:
    """Action vector layout, bounds and semantics (see the module docstring); every field holds
    one value per component."""

    names: tuple[str, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    units: tuple[str, ...]
    kinds: tuple[ActionKind, ...]
    state_index: tuple[int | None, ...]
    """The state component a ``delta`` or ``absolute`` component acts on; None for ``effort``."""
    scale: tuple[float, ...]
    """State units per action unit of a ``delta`` (1 for rp5's joint deltas); 1 otherwise."""
    travel: tuple[float, ...]
    """The largest magnitude a ``delta`` can mean (the whole travel of what it moves, action
    units); for the other kinds, the tolerance :func:`action_fault` allows either side of
    ``[low, high]`` (their width: policies overshoot a little and the driver clips that)."""
    home: tuple[float, ...]
    """What holding commands before anything was measured or sent: 0 for a ``delta``, the home
    value of an ``absolute``, the neutral command of an ``effort``."""
    moves: tuple[str, ...]
    """What each component acts on, for messages: ``joint base_yaw``, ``gripper opening``."""

    def __post_init__(self) -> None:
        lengths = {len(f) for f in (self.low, self.high, self.units, self.kinds)}
        lengths |= {len(f) for f in (self.state_index, self.scale, self.travel, self.home)}
        if lengths | {len(self.moves)} != {len(self.names)}:
            raise RobotDefinitionError(f"action {self.names}: one value per component needed")
        for name, kind, index in zip(self.names, self.kinds, self.state_index, strict=True):
            if (kind == "effort") != (index is None):
                raise RobotDefinitionError(
                    f"action {name!r} ({kind}): a state_index is needed exactly when the kind is "
                    "delta or absolute"
                )

    @property
    def dim(self) -> int:
        """Number of action components."""
        return len(self.names)

    def of_kind(self, *kinds: ActionKind) -> np.ndarray:
        """Indices of the components of these kinds, ascending."""
        return np.array([k for k, kind in enumerate(self.kinds) if kind in kinds], dtype=np.intp)

    def acts_on(self, kind: ActionKind) -> tuple[np.ndarray, np.ndarray]:
        """``(components, state components)`` of the ``kind`` components: index arrays of equal
        length, the second the ``state_index`` of each."""
        comps = self.of_kind(kind)
        return comps, np.array([self.state_index[k] for k in comps], dtype=np.intp)


@dataclass(frozen=True)
class RobotSpec:
    """A validated robot: its control rate, cameras, action and state layout; for a robot
    compiled from MJCF (:func:`load_robot`), also its definition and joints with limits.

    A robot whose model lives outside this environment (Meta-World's Sawyer) is *declared*: a
    ``RobotSpec`` built directly, with no ``definition``; only the simulator backends that build
    a scene from MJCF (the touch ones) need :attr:`authored`."""

    name: str
    """Registry name, e.g. ``rp5``."""
    description: str
    """One line for ``robo-pipe`` listings."""
    control_hz: float
    """Control rate in Hz: one action per ``1/control_hz`` seconds."""
    cameras: tuple[CameraSpec, ...]
    action: ActionSpec
    state_names: tuple[str, ...]
    """Observation state components, with their unit's quantity (``base_yaw.pos``)."""
    state_units: tuple[str, ...]
    """The unit of each state component (``rad``, ``m``; ``""``: unitless)."""
    definition: RobotDefinition | None = None
    """The MJCF definition it was compiled from; None for a declared robot."""
    arm: tuple[JointSpec, ...] = field(default=())
    gripper: tuple[JointSpec, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.control_hz > 0:
            raise RobotDefinitionError(f"robot {self.name!r}: control_hz must be > 0")
        for name, index in zip(self.action.names, self.action.state_index, strict=True):
            if index is not None and not 0 <= index < len(self.state_names):
                raise RobotDefinitionError(
                    f"robot {self.name!r}: action {name!r} acts on state component {index}, "
                    f"but the state has {len(self.state_names)}"
                )
        if len(self.state_units) != len(self.state_names):
            raise RobotDefinitionError(
                f"robot {self.name!r}: {len(self.state_units)} state units for "
                f"{len(self.state_names)} state components"
            )

    @property
    def authored(self) -> RobotDefinition:
        """The MJCF definition (joints, tool site, home pose, physics timestep) of a robot
        compiled from one; a declared robot has none."""
        if self.definition is None:
            raise RobotDefinitionError(
                f"robot {self.name!r} is declared without an MJCF model: it runs only on "
                "backends that bring their own"
            )
        return self.definition

    @property
    def substeps(self) -> int:
        """Physics steps per control step (MJCF robots)."""
        return round(1.0 / (self.control_hz * self.authored.physics_timestep))

    @property
    def state_dim(self) -> int:
        """Length of the proprioceptive state vector."""
        return len(self.state_names)

    @property
    def state_units_text(self) -> str:
        """The state's units in a few words: ``rad (shoulder_pan.pos … wrist_roll.pos), m
        (gripper.opening)`` (what an export's io_spec says of its ``state`` input)."""
        return units_text(self.state_names, self.state_units)

    @property
    def action_units_text(self) -> str:
        """The action's units in a few words, as :attr:`state_units_text`."""
        return units_text(self.action.names, self.action.units)

    @property
    def max_gripper_opening(self) -> float:
        """Fully open gripper, m (sum of the finger travels; MJCF robots)."""
        return sum(j.high for j in self.gripper)

    def chunk_targets(self, chunk: np.ndarray, state: np.ndarray) -> np.ndarray:
        """A chunk of actions ``(L, action.dim)``, computed from an observation whose state was
        ``state``, as the targets it plans ``(L, action.dim)``, in action units: a ``delta`` is
        relative to the measured state, so action ``i`` plans ``state + scale * (deltas[0..i]
        summed)`` (each step clipped to the action bounds, as sending it would, and assumed
        reached), divided back by ``scale``; ``absolute`` and ``effort`` components are targets
        already.

        Why: a chunk executed later than its observation (asynchronous execution) meets a robot
        that has moved meanwhile; its relative actions would then add the motion a second
        time, its planned targets stay right. :meth:`action_toward` turns a target back into an
        action for the state measured when it is sent."""
        comps, states, scale, low, high = self._deltas()
        targets = np.array(chunk, dtype=np.float32, copy=True)
        # A step past the action bounds is clipped when sent: plan what can be reached.
        steps = np.clip(targets[:, comps], low, high)
        targets[:, comps] = state[states] / scale + np.cumsum(steps, axis=0)
        return targets

    def chunk_from_targets(self, targets: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`chunk_targets`: planned targets ``(L, action.dim)`` as the
        actions of a chunk computed from an observation whose state is ``state`` (a ``delta``
        is the step from the state, then from the target before; the rest as planned). How a
        delay-conditioned policy is told the actions already committed
        (:func:`deploy_edge.async_loop.committed_prefix`)."""
        comps, states, scale, _, _ = self._deltas()
        actions = np.array(targets, dtype=np.float32, copy=True)
        if len(actions):
            start = np.asarray(state, dtype=np.float32)[states] / scale
            before = np.vstack([start[None], actions[:-1, comps]])
            actions[:, comps] = actions[:, comps] - before
        return actions

    def action_toward(self, target: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The action that moves the robot, measured at ``state``, to the planned ``target`` (a
        row of :meth:`chunk_targets`): a ``delta`` is ``target - measured`` (in action units)
        clipped to the action bounds (rp5: ``±max_joint_delta``), the rest as planned."""
        comps, states, scale, low, high = self._deltas()
        action = np.array(target, dtype=np.float32, copy=True)
        action[comps] = np.clip(target[comps] - state[states] / scale, low, high)
        return action

    def _deltas(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The ``delta`` components: their indices, the state components they act on, their
        scales and their action bounds."""
        comps, states = self.action.acts_on("delta")
        scale = np.asarray(self.action.scale, dtype=np.float32)[comps]
        return (
            comps,
            states,
            scale,
            np.asarray(self.action.low)[comps],
            np.asarray(self.action.high)[comps],
        )

    def hold_action(self, state: np.ndarray, last: np.ndarray | None = None) -> np.ndarray:
        """The safe action for robots whose state was ``state``, shape ``(..., state_dim)``: no
        motion. Shape ``(..., action.dim)``, float32: a ``delta`` is 0, an ``absolute`` the
        measured value of its state component (where that is not finite: ``last``, the action
        sent before, else its home value, so a NaN reading never becomes a NaN command), an
        ``effort`` ``last``'s (else its neutral value)."""
        state = np.asarray(state, dtype=np.float32)
        shape = (*state.shape[:-1], self.action.dim)
        held = np.broadcast_to(np.asarray(self.action.home, dtype=np.float32), shape).copy()
        if last is not None:
            kept = self.action.of_kind("absolute", "effort")
            known = np.isfinite(last[..., kept])
            held[..., kept] = np.where(known, last[..., kept], held[..., kept])
        comps, states = self.action.acts_on("absolute")
        measured = state[..., states]
        held[..., comps] = np.where(np.isfinite(measured), measured, held[..., comps])
        held[..., self.action.of_kind("delta")] = 0.0
        return held

    def load_model(self) -> mujoco.MjModel:
        """Compile the robot's MJCF on its own (no scene)."""
        return _compile(self.authored.mjcf)


_REGISTRY: dict[str, str] = {"rp5": "robots.rp5:RP5", "sawyer": "robots.sawyer:SAWYER"}
"""Robot name -> ``module:attr`` of its :class:`RobotDefinition` (compiled from MJCF) or its
declared :class:`RobotSpec`."""


def available_robots() -> list[str]:
    """Names accepted by :func:`get_robot`."""
    return sorted(_REGISTRY)


def get_robot(name: str) -> RobotSpec:
    """Load a registered robot by name; unknown names list the valid ones."""
    if name not in _REGISTRY:
        raise RobotDefinitionError(
            f"unknown robot {name!r}; valid choices: {', '.join(available_robots())}"
        )
    robot = pkgutil.resolve_name(_REGISTRY[name])
    return robot if isinstance(robot, RobotSpec) else load_robot(robot)


def _compile(path: Path) -> mujoco.MjModel:
    import mujoco

    if not path.is_file():
        raise RobotDefinitionError(f"{path}: MJCF file not found")
    try:
        return mujoco.MjModel.from_xml_path(str(path))
    except ValueError as err:  # MuJoCo reports parse and compile errors as ValueError
        raise RobotDefinitionError(f"{path}: malformed MJCF: {err}") from err


def load_robot(definition: RobotDefinition) -> RobotSpec:
    """Compile ``definition.mjcf``, check it against the definition, and return the spec.

    Raises:
        RobotDefinitionError: malformed MJCF, a named joint/actuator/site/camera missing, a joint
            range that is empty, unlimited or not finite, an actuator range outside its joint's
            range, a home pose outside the limits, or a control rate the timestep cannot divide.
    """
    import mujoco

    path = definition.mjcf
    model = _compile(path)

    def fail(what: str) -> RobotDefinitionError:
        return RobotDefinitionError(f"{path}: robot {definition.name!r}: {what}")

    def joint(name: str) -> JointSpec:
        jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            raise fail(f"joint {name!r} not found in the MJCF")
        low, high = (float(v) for v in model.jnt_range[jid])
        if not model.jnt_limited[jid] or not (math.isfinite(low) and math.isfinite(high)):
            raise fail(f"joint {name!r} has no finite limits (range={low} {high})")
        if low >= high:
            raise fail(f"joint {name!r} has an invalid range: low {low} >= high {high}")
        aid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, name)
        if aid < 0:
            raise fail(f"joint {name!r} has no actuator of the same name")
        c_low, c_high = (float(v) for v in model.actuator_ctrlrange[aid])
        if c_low < low - 1e-9 or c_high > high + 1e-9 or c_low >= c_high:
            raise fail(
                f"actuator {name!r} ctrlrange [{c_low}, {c_high}] must lie inside "
                f"joint range [{low}, {high}]"
            )
        return JointSpec(name, low, high)

    arm = tuple(joint(n) for n in definition.arm_joints)
    gripper = tuple(joint(n) for n in definition.gripper_joints)
    if len(arm) < 1:
        raise fail("needs at least one arm joint")
    if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, definition.tcp_site) < 0:
        raise fail(f"tcp site {definition.tcp_site!r} not found")
    cameras = []
    for cam in definition.cameras:
        cid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, cam)
        if cid < 0:
            raise fail(f"camera {cam!r} not found")
        cameras.append(CameraSpec(cam, float(model.cam_fovy[cid])))
    if definition.control_hz <= 0 or definition.physics_timestep <= 0:
        raise fail(
            f"control_hz ({definition.control_hz}) and physics_timestep "
            f"({definition.physics_timestep}) must be > 0"
        )
    ratio = 1.0 / (definition.control_hz * definition.physics_timestep)
    if abs(ratio - round(ratio)) > 1e-6:
        raise fail(
            f"control period 1/{definition.control_hz} s is not a whole number of "
            f"physics_timestep {definition.physics_timestep} s"
        )
    if len(definition.home_arm) != len(arm):
        raise fail(f"home_arm has {len(definition.home_arm)} values for {len(arm)} arm joints")
    for j, q in zip(arm, definition.home_arm, strict=True):
        if not j.low <= q <= j.high:
            raise fail(f"home position {q} of joint {j.name!r} is outside [{j.low}, {j.high}]")
    if definition.max_joint_delta <= 0:
        raise fail(f"max_joint_delta must be > 0 rad, got {definition.max_joint_delta}")

    opening = sum(j.high for j in gripper)
    d = definition.max_joint_delta
    delta: ActionKind = "delta"
    action = ActionSpec(
        names=(*(f"{j.name}.delta" for j in arm), "gripper.opening"),
        low=(*(-d for _ in arm), 0.0),
        high=(*(d for _ in arm), opening),
        units=(*("rad" for _ in arm), "m"),
        kinds=(*(delta for _ in arm), "absolute"),
        state_index=tuple(range(len(arm) + 1)),
        scale=tuple(1.0 for _ in range(len(arm) + 1)),
        travel=(*(j.high - j.low for j in arm), opening),
        home=(*(0.0 for _ in arm), definition.home_gripper),
        moves=(*(f"joint {j.name}" for j in arm), "gripper opening"),
    )
    state_names = (*(f"{j.name}.pos" for j in arm), "gripper.opening")
    return RobotSpec(
        name=definition.name,
        description=definition.description,
        control_hz=definition.control_hz,
        cameras=tuple(cameras),
        action=action,
        state_names=state_names,
        state_units=(*("rad" for _ in arm), "m"),
        definition=definition,
        arm=arm,
        gripper=gripper,
    )


def units_text(names: tuple[str, ...], units: tuple[str, ...]) -> str:
    """Components and their units, runs of one unit grouped: ``rad (a.pos … c.pos), m
    (gripper.opening)``; a unitless one is ``1``."""
    groups: list[tuple[str, list[str]]] = []
    for name, unit in zip(names, units, strict=True):
        if groups and groups[-1][0] == (unit or "1"):
            groups[-1][1].append(name)
        else:
            groups.append((unit or "1", [name]))
    return ", ".join(
        f"{unit} ({members[0]}{' … ' + members[-1] if len(members) > 1 else ''})"
        for unit, members in groups
    )
