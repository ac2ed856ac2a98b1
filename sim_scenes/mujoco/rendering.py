"""Offscreen rendering of batched MuJoCo environments without a GPU (EGL or OSMesa).

A render context serves many environments: they differ only in colours, light and camera
positions, which :func:`mujoco.mjv_updateScene` reads from the model passed to it, not from the
render context. :class:`BatchedRenderer` splits the environments over worker threads, each with
its own OpenGL context; Mesa's software rasteriser then keeps both cores busy.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import mujoco
import numpy as np

from sim_scenes.errors import SceneError

GL_BACKENDS = ("egl", "osmesa", "glfw")


def make_gl_context(size: int) -> Any:
    """An offscreen OpenGL context from the backend ``MUJOCO_GL`` names (default ``egl``).

    Chosen here rather than by MuJoCo at import time, so it works whatever imported ``mujoco``
    first. EGL and OSMesa need Mesa's libraries (``make system-deps`` installs them).
    """
    backend = os.environ.get("MUJOCO_GL", "egl").lower()
    # llvmpipe's own rasteriser threads cost more than they save on 64x64 frames (measured:
    # 0.87 -> 0.59 ms a frame); BatchedRenderer parallelises across frames instead.
    os.environ.setdefault("LP_NUM_THREADS", "0")
    try:
        if backend == "egl":
            from mujoco.egl import GLContext
        elif backend == "osmesa":
            from mujoco.osmesa import GLContext
        elif backend == "glfw":
            from mujoco.glfw import GLContext
        else:
            raise SceneError(
                f"MUJOCO_GL={backend!r} cannot render offscreen; valid choices: "
                f"{', '.join(GL_BACKENDS)}"
            )
        return GLContext(size, size)
    except (ImportError, RuntimeError, OSError) as err:
        raise SceneError(
            f"cannot create an offscreen OpenGL context with MUJOCO_GL={backend}: {err}. "
            "Install Mesa's EGL/OSMesa libraries (bash scripts/install_system_deps.sh) "
            "or try MUJOCO_GL=osmesa."
        ) from err


class OffscreenRenderer:
    """Renders ``(size, size, 3)`` uint8 RGB frames of any model with the same assets."""

    def __init__(self, model: mujoco.MjModel, size: int) -> None:
        self.size = size
        self._gl = make_gl_context(size)
        self._gl.make_current()
        self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._context)
        self._scene = mujoco.MjvScene(model, maxgeom=256)
        self._option = mujoco.MjvOption()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._rect = mujoco.MjrRect(0, 0, size, size)
        self._closed = False

    def render(
        self, model: mujoco.MjModel, data: mujoco.MjData, camera_id: int, out: np.ndarray
    ) -> None:
        """Render camera ``camera_id`` of ``data`` into ``out`` (uint8, (size, size, 3)).

        ``data`` must have current kinematics (``mj_kinematics`` and ``mj_camlight``).
        """
        self._gl.make_current()
        self._camera.fixedcamid = camera_id
        mujoco.mjv_updateScene(
            model, data, self._option, None, self._camera, mujoco.mjtCatBit.mjCAT_ALL, self._scene
        )
        mujoco.mjr_render(self._rect, self._scene, self._context)
        mujoco.mjr_readPixels(out, None, self._rect, self._context)
        out[:] = out[::-1]  # OpenGL rows run bottom-up

    def close(self) -> None:
        """Free the GL resources; safe to call twice."""
        if not self._closed:
            self._context.free()
            self._gl.free()
            self._closed = True


_STATE_SPEC = mujoco.mjtState.mjSTATE_FULLPHYSICS


class _RenderWorker(threading.Thread):
    """A thread that owns one GL context and renders the jobs sent to it, in order."""

    def __init__(self, nominal: mujoco.MjModel, size: int) -> None:
        super().__init__(daemon=True, name="robo-pipe-render")
        self._nominal, self._size = nominal, size
        self._jobs: queue.Queue[
            tuple[Callable[[OffscreenRenderer, mujoco.MjData], None], Future[None]] | None
        ] = queue.Queue()
        self.ready: Future[None] = Future()
        self.start()

    def run(self) -> None:
        try:
            renderer = OffscreenRenderer(self._nominal, self._size)
            data = mujoco.MjData(self._nominal)
        except Exception as err:  # reported to the constructor through `ready`
            self.ready.set_exception(err)
            return
        self.ready.set_result(None)
        while (job := self._jobs.get()) is not None:
            work, done = job
            try:
                work(renderer, data)
                done.set_result(None)
            except Exception as err:
                done.set_exception(err)
        renderer.close()  # GL contexts are freed on the thread they are current on

    def submit(self, work: Callable[[OffscreenRenderer, mujoco.MjData], None]) -> Future[None]:
        done: Future[None] = Future()
        self._jobs.put((work, done))
        return done

    def stop(self) -> None:
        self._jobs.put(None)
        self.join(timeout=10)


class BatchedRenderer:
    """Renders every camera of N environments from their physics states, on worker threads.

    Args:
        nominal: the compiled scene (all environment models are copies of it).
        size: square image side in pixels.
        camera_ids: MuJoCo camera ids to render.
        num_threads: render threads (>= 1).
    """

    def __init__(
        self, nominal: mujoco.MjModel, size: int, camera_ids: Sequence[int], num_threads: int
    ) -> None:
        self.camera_ids = list(camera_ids)
        self._workers = [_RenderWorker(nominal, size) for _ in range(num_threads)]
        try:
            for worker in self._workers:
                worker.ready.result()
        except Exception:
            self.close()
            raise

    def render(
        self,
        models: Sequence[mujoco.MjModel],
        states: np.ndarray,
        out: Sequence[np.ndarray],
        env_ids: Sequence[int] | None = None,
    ) -> None:
        """Render environment ``e``'s camera ``k`` into ``out[k][e]`` (uint8, (N, H, W, 3)).

        ``states``: full physics states, shape (N, nstate) (``mjSTATE_FULLPHYSICS``).
        ``env_ids``: render only these environments (default: all).
        """
        ids = list(range(len(models))) if env_ids is None else list(env_ids)

        def work(envs: Sequence[int]) -> Callable[[OffscreenRenderer, mujoco.MjData], None]:
            def draw(renderer: OffscreenRenderer, data: mujoco.MjData) -> None:
                for e in envs:
                    mujoco.mj_setState(models[e], data, states[e], _STATE_SPEC)
                    mujoco.mj_kinematics(models[e], data)
                    mujoco.mj_camlight(models[e], data)
                    for k, cam in enumerate(self.camera_ids):
                        renderer.render(models[e], data, cam, out[k][e])

            return draw

        k = len(self._workers)
        futures = [w.submit(work(ids[i::k])) for i, w in enumerate(self._workers) if ids[i::k]]
        for future in futures:
            future.result()

    def close(self) -> None:
        """Stop the workers and free their GL contexts; safe to call twice."""
        for worker in self._workers:
            if worker.is_alive():
                worker.stop()
        self._workers = []
