"""An MJCF robot's joints in a position controller's order, and the conversions between them and
the robot's state and actions (rp5: arm joint deltas, a gripper opening shared by its fingers).

One place for what the driver sends, the twin applies and records, and the bag importer reads
back: a policy's action becomes position targets exactly as the simulator applies it. Arrays
of joints are ``(..., n_joints)`` in :attr:`JointOrder.order`. No ROS import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from robots.spec import RobotSpec


class JointOrder:
    """``spec``'s arm and gripper joints in ``order`` (default: the spec's, arm then gripper)."""

    def __init__(self, spec: RobotSpec, order: list[str] | None = None) -> None:
        self.spec = spec
        self.order = order or [j.name for j in (*spec.arm, *spec.gripper)]
        self._arm = [self.order.index(j.name) for j in spec.arm]
        self._fingers = [self.order.index(j.name) for j in spec.gripper]
        limits = {j.name: (j.low, j.high) for j in (*spec.arm, *spec.gripper)}
        self.low = np.array([limits[n][0] for n in self.order])
        self.high = np.array([limits[n][1] for n in self.order])
        """Each joint's travel, rad (m for a prismatic joint)."""

    def state(self, positions: np.ndarray) -> np.ndarray:
        """Joint positions -> the spec's state, float32: arm joints, then the gripper opening
        (the fingers' sum)."""
        positions = np.asarray(positions, dtype=np.float64)
        opening = positions[..., self._fingers].sum(axis=-1, keepdims=True)
        return np.concatenate([positions[..., self._arm], opening], axis=-1).astype(np.float32)

    def positions(self, state: np.ndarray) -> np.ndarray:
        """The spec's state -> every joint's position, float64: each finger half the opening
        (the simulated fingers move together)."""
        state = np.asarray(state, dtype=np.float64)
        n_arm = len(self._arm)
        positions = np.empty((*state.shape[:-1], len(self.order)))
        positions[..., self._arm] = state[..., :n_arm]
        positions[..., self._fingers] = state[..., n_arm : n_arm + 1] / len(self._fingers)
        return positions

    def targets(self, action: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The position targets ``action`` (clipped to the action bounds) asks of joints at
        ``positions``: each arm joint moved by its delta, the fingers sharing the opening. Not
        clipped to the joints' travel (:attr:`low`, :attr:`high`: a driver's rule)."""
        action = np.clip(action, self.spec.action.low, self.spec.action.high)
        targets = np.array(positions, dtype=np.float64, copy=True)
        n_arm = len(self._arm)
        targets[..., self._arm] += action[..., :n_arm]
        targets[..., self._fingers] = action[..., n_arm : n_arm + 1] / len(self._fingers)
        return targets

    def action(self, targets: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The action that moves joints at ``positions`` toward ``targets``, clipped to the
        action bounds, float64: the arm's deltas, the fingers' summed opening."""
        targets = np.asarray(targets, dtype=np.float64)
        positions = np.asarray(positions, dtype=np.float64)
        arm = targets[..., self._arm] - positions[..., self._arm]
        opening = targets[..., self._fingers].sum(axis=-1, keepdims=True)
        action = np.concatenate([arm, opening], axis=-1)
        return np.clip(action, self.spec.action.low, self.spec.action.high)


def check_names(
    spec: RobotSpec,
    joints: Mapping[str, str],
    order: list[str] | None,
    cameras: Iterable[str],
    fields: tuple[str, str, str],
) -> None:
    """ValueError naming the field when names do not fit ``spec``: ``joints`` (the spec's joint
    -> a ROS name) must map every joint and no other, ``order`` (None: the spec's) list each
    once, ``cameras`` be the spec's. ``fields``: the file's names for the three."""
    joints_field, order_field, cameras_field = fields
    names = [j.name for j in (*spec.arm, *spec.gripper)]
    if unknown := sorted(set(joints) - set(names)):
        raise ValueError(
            f"field '{joints_field}': {', '.join(unknown)}: robot {spec.name} has no such "
            f"joint (its joints: {', '.join(names)})"
        )
    if missing := [n for n in names if n not in joints]:
        raise ValueError(
            f"field '{joints_field}': robot {spec.name}'s {', '.join(missing)} unmapped"
        )
    if sorted(order or names) != sorted(names):
        raise ValueError(
            f"field '{order_field}' = {order}: must list each of {', '.join(names)} once"
        )
    known = [c.name for c in spec.cameras]
    if unknown := sorted(set(cameras) - set(known)):
        raise ValueError(
            f"field '{cameras_field}': {', '.join(unknown)}: robot {spec.name} has no such "
            f"camera (its cameras: {', '.join(known)})"
        )
