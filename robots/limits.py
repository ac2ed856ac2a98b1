"""What may reach a robot: the one rule every boundary between a policy and a robot applies
(the policy server, both control loops, so the latency gate and the health check, and the
export's parity check): observations and actions are finite (:func:`non_finite`,
:func:`observation_fault`), and actions are ones the robot could mean at all
(:func:`action_fault`, by each component's kind and travel, :class:`robots.spec.ActionSpec`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from robots.spec import RobotSpec


def non_finite(field: str, values: np.ndarray) -> str:
    """Why ``values``, the observation or action field called ``field``, must not reach a
    robot: ``"state[2] = nan"``, its first non-finite element; "" when every element is finite
    (integer arrays, uint8 images, always are).

    The rule every boundary between a policy and a robot applies to observations (the policy
    server, both control loops, so the gate and the health check) and to actions, within
    :func:`action_fault`; the export's parity check applies it to its outputs. Why: a clip
    cannot make such a value safe: ``np.clip`` passes NaN through and turns inf into a
    full-range command, and a driver forwards either to the arm."""
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating):
        return ""
    bad = np.argwhere(~np.isfinite(array))
    if not len(bad):
        return ""
    index = tuple(int(i) for i in bad[0])
    return f"{field}[{', '.join(map(str, index))}] = {array[index]}"


def observation_fault(images: Mapping[str, np.ndarray], state: np.ndarray) -> str:
    """:func:`non_finite` of an observation: its ``state``, then each camera's image (field
    ``image_<camera>``); "" when all are finite."""
    fields = {"state": state, **{f"image_{camera}": image for camera, image in images.items()}}
    return next((reason for f, v in fields.items() if (reason := non_finite(f, v))), "")


def action_fault(spec: RobotSpec, field: str, actions: np.ndarray) -> str:
    """Why ``actions``, shape ``(..., action.dim)``, the field called ``field``, must not reach
    ``spec``'s robot: its first value that cannot be a command for this robot at all, e.g.
    ``"action[0, 2] = 7.1 rad: beyond joint elbow_pitch's travel of 2.9 rad"``; "" when every
    action is one.

    An action is outside the robot's limits, and refused, when it is
    - non-finite (:func:`non_finite`);
    - a ``delta`` whose magnitude exceeds the whole travel of what it moves
      (:attr:`ActionSpec.travel`; rp5: ``high - low`` of the joint, from the MJCF): a target
      no clip can make meaningful;
    - an ``absolute`` or ``effort`` outside ``[low - travel, high + travel]`` (``travel = high -
      low``; rp5's gripper opening: ``[-0.06, 0.12]`` m): one travel of tolerance either side,
      because policies overshoot a little and the driver clips that.

    Finite actions inside these are not refused: the driver clips them to the action bounds
    (:meth:`Robot.act <robots.interface.Robot.act>`), as :meth:`RobotSpec.chunk_targets` plans.
    Why not refuse at the bounds themselves: an arm bound is a rate limit (``±max_joint_delta``
    per control step), and policies legitimately ask for more and get the clipped step (trained
    exports were measured up to 0.086 rad against 0.08).

    The one rule for actions at every boundary between a policy and a robot: the policy
    server, both control loops, so the gate and the health check."""
    if refused := non_finite(field, actions):
        return refused
    spec_action = spec.action
    array = np.asarray(actions, dtype=np.float64)
    low, high = np.asarray(spec_action.low), np.asarray(spec_action.high)
    travel = np.asarray(spec_action.travel)
    is_delta = np.array([kind == "delta" for kind in spec_action.kinds])
    beyond = np.where(
        is_delta, np.abs(array) > travel, (array < low - travel) | (array > high + travel)
    )
    bad = np.argwhere(beyond)
    if not len(bad):
        return ""
    index = tuple(int(i) for i in bad[0])
    value, k = array[index], index[-1]
    unit = f" {spec_action.units[k]}".rstrip()  # "" for a unitless effort
    where = f"{field}[{', '.join(map(str, index))}] = {value:.3g}{unit}"
    if is_delta[k]:
        return f"{where}: beyond {spec_action.moves[k]}'s travel of {travel[k]:.3g}{unit}"
    return (
        f"{where}: a {spec_action.moves[k]} outside [{low[k] - travel[k]:.3g}, "
        f"{high[k] + travel[k]:.3g}]{unit} (its range {low[k]:.3g}..{high[k]:.3g}{unit}, one "
        "travel either side)"
    )
