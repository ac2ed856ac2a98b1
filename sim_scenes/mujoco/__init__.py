"""The MuJoCo backend (``sim.backend: mujoco``, the default): the touch task's scene in MJCF
(:mod:`~sim_scenes.mujoco.touch_scene`), N environments stepped by ``mujoco.rollout`` threads
(:mod:`~sim_scenes.mujoco.mujoco_env`) and offscreen rendering without a GPU
(:mod:`~sim_scenes.mujoco.rendering`). Chosen by name in :mod:`sim_scenes.backends`."""
