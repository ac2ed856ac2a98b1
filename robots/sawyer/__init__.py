"""sawyer: Rethink Robotics' Sawyer as Meta-World v3 (``metaworld==3.1.1``) drives it.

Declared, not compiled: its MJCF lives in the Meta-World environment (which pins another MuJoCo),
so this spec states what a policy sees and commands, and the Meta-World worker reports the real
values that a test compares with it (``tests/sim_scenes/test_metaworld.py``):

- control at 80 Hz (Meta-World's ``frame_skip`` 5 x 2.5 ms timestep);
- state ``(7,)``: the hand's position (m, world frame), the gripper's opening (the fingers'
  distance over 0.1 m, clipped to 0..1), the first 4 of Meta-World's observation (LeRobot's
  Meta-World env calls them ``agent_pos``), and the task's goal position (m, world frame), the
  last 3: MT10 is Meta-World's goal-observable benchmark, and at 64 px the goal marker is a few
  pixels (without it, push and pick-place moved the puck but never to its goal: 20% and 10%);
- cameras: Meta-World's seven, and robo-pipe's ``workspace`` (a free camera the worker frames
  on the table, for small images: ``sim_scenes/metaworld/worker.py``);
- action ``(4,)``: hand displacements (Meta-World's ``action_scale`` 0.01 m per action unit,
  clipped to [-1, 1]) and the gripper's effort (-1 opens, +1 closes; no state component
  measures it, so holding keeps the effort last sent).
"""

from robots.spec import ActionSpec, CameraSpec, RobotSpec

HAND_STEP_M = 0.01
"""Hand displacement per action unit, m (Meta-World's ``action_scale``)."""

SAWYER = RobotSpec(
    name="sawyer",
    description="Sawyer as Meta-World v3 drives it: hand-space deltas and a gripper effort",
    control_hz=80.0,
    cameras=(
        CameraSpec("corner", 45.0),
        CameraSpec("corner2", 60.0),
        CameraSpec("corner3", 45.0),
        CameraSpec("corner4", 60.0),
        CameraSpec("topview", 45.0),
        CameraSpec("behindGripper", 60.0),
        CameraSpec("gripperPOV", 90.0),
        # robo-pipe's own: the table's workspace, framed for small images (the worker's
        # WORKSPACE_VIEW); its field of view is the scene's free-camera one
        CameraSpec("workspace", 45.0),
    ),
    action=ActionSpec(
        names=("hand.dx", "hand.dy", "hand.dz", "gripper.effort"),
        low=(-1.0, -1.0, -1.0, -1.0),
        high=(1.0, 1.0, 1.0, 1.0),
        units=("cm", "cm", "cm", ""),
        kinds=("delta", "delta", "delta", "effort"),
        state_index=(0, 1, 2, None),
        scale=(HAND_STEP_M, HAND_STEP_M, HAND_STEP_M, 1.0),
        # A displacement of over 1 m in one 12.5 ms tick is no command; the effort gets one
        # range of tolerance either side, as rp5's gripper.
        travel=(100.0, 100.0, 100.0, 2.0),
        home=(0.0, 0.0, 0.0, -1.0),
        moves=("hand x", "hand y", "hand z", "gripper effort"),
    ),
    state_names=("hand.x", "hand.y", "hand.z", "gripper.opening", "goal.x", "goal.y", "goal.z"),
    state_units=("m", "m", "m", "", "m", "m", "m"),
)
