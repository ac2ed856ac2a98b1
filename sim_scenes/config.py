"""Typed configuration of the simulated task and its backend (sections of a pipeline config)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from robo_pipe.validation import one_of
from sim_scenes.tasks import TaskVariant, resolve_task


class RewardConfig(BaseModel):
    """Weights of the task's reward (:class:`sim_scenes.rewards.RewardTerms`); a field left
    unset keeps the scene variant's own weight (a Meta-World task, whose own reward is
    Meta-World's: :class:`~sim_scenes.rewards.RewardTerms`' default). RL fine-tuning's rollouts
    play the task with these applied (:meth:`SceneConfig.rl_task`); datasets record the
    variant's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    success_bonus: float | None = Field(default=None, ge=0.0, le=1000.0)
    """Paid once, on the step the episode is solved."""
    distance_weight: float | None = Field(default=None, ge=0.0, le=1000.0)
    """Per metre of the distance the task must close (touch: tool centre point to target;
    Meta-World: the task's object, or reach's hand, to its goal), every step."""
    progress_weight: float | None = Field(default=None, ge=0.0, le=1000.0)
    """Per metre that distance shrank during a step."""


class SuccessConfig(BaseModel):
    """When an episode counts as solved (:class:`sim_scenes.touch.SuccessCriterion`); a field
    left unset keeps the scene variant's own value."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    radius: float | None = Field(default=None, gt=0.0, le=0.5)
    """m, tool centre point to the named object's centre. The objects are 5 cm across, so
    the tool centre point resting on one is about 3 cm from its centre."""
    hold_steps: int | None = Field(default=None, ge=1, le=100)
    """Consecutive control steps inside ``radius``."""


class SceneConfig(BaseModel):
    """Which task variant to simulate and what the policy sees."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variant: str = "touch-mixed"
    """The task: ``[FAMILY/]VARIANT`` (a bare name is a touch variant; ``robo-pipe scenes``
    lists them all). It decides the robot and the backends that can play it
    (:mod:`sim_scenes.tasks`)."""
    cameras: list[str] = Field(default=["scene"], min_length=1)
    """Cameras rendered into observations, from the robot's cameras."""
    image_size: int = Field(default=64, ge=16, le=512)
    """Square image side, pixels."""
    reward: RewardConfig = RewardConfig()
    """Reward weights for RL fine-tuning (unset: the variant's)."""
    success: SuccessConfig = SuccessConfig()
    """A stricter (or looser) success criterion than the variant's (unset: the variant's).
    It applies to everything simulated: demonstrations, RL and evaluation."""
    episode_steps: int | None = Field(default=None, ge=1, le=10_000)
    """Control steps before an episode is cut (unset: the variant's, 50 = 5 s at 10 Hz)."""

    def task(self, variant: str | None = None) -> TaskVariant:
        """The scene variant (``variant``, default this config's) with this config's success
        criterion and episode length applied: what every backend simulates.

        Raises:
            SceneError: an override the variant's family cannot apply (Meta-World's success).
        """
        return self._overridden(variant or self.variant, reward=False)

    def _overridden(self, name: str, *, reward: bool) -> TaskVariant:
        family, variant = resolve_task(name)
        return family.with_overrides(
            family.variant(variant),
            success=self.success.model_dump(exclude_none=True),
            reward=self.reward.model_dump(exclude_none=True) if reward else {},
            episode_steps=self.episode_steps,
        )

    def task_overrides(self) -> dict[str, Any]:
        """The success and episode-length overrides that are set, as JSON (empty by default):
        what a cache key must add so that scenes of the variant's own task keep their keys."""
        overrides: dict[str, Any] = {}
        success = self.success.model_dump(exclude_none=True)
        if success:
            overrides["success"] = success
        if self.episode_steps is not None:
            overrides["episode_steps"] = self.episode_steps
        return overrides

    def rl_task(self) -> TaskVariant:
        """:meth:`task` with this config's reward overrides (``scene.reward``) applied: what
        RL's rollouts play, their reward the simulator's own. Only RL's: datasets and
        evaluations record the variant's own reward, so that they stay shareable."""
        return self._overridden(self.variant, reward=True)

    @field_validator("variant")
    @classmethod
    def _known_variant(cls, name: str) -> str:
        resolve_task(name)  # its SceneError is a ValueError: pydantic reports the message
        return name

    @model_validator(mode="after")
    def _applicable_overrides(self) -> SceneConfig:
        self.rl_task()  # a family that keeps its own success or reward refuses an override
        return self


BACKENDS: dict[str, str] = {
    "mujoco": "sim_scenes.mujoco.mujoco_env:MujocoBatchedEnv",
    "isaaclab": "sim_scenes.isaaclab.client:IsaacLabBatchedEnv",
    "metaworld": "sim_scenes.metaworld.batched:MetaWorldBatchedEnv",
}
"""``sim.backend`` -> ``module:class`` of its batched env: MuJoCo (built in, the default),
Isaac Lab 3 on Newton and Meta-World (each in its own environment: ``make isaaclab-env``,
``make metaworld-env``)."""


class SimConfig(BaseModel):
    """Simulator backend and its parallelism."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    backend: Annotated[str, AfterValidator(one_of(BACKENDS, "simulator backend"))] = "mujoco"
    """Simulator backend, one of :data:`BACKENDS`: ``mujoco`` (built in)
    or ``isaaclab`` (Isaac Lab 3 on Newton, in its own environment: ``make isaaclab-env``)."""
    num_envs: int = Field(default=16, ge=1, le=4096)
    """Environments stepped together in one process."""
    num_threads: int = Field(default=2, ge=1, le=256)
    """Physics threads for the batched rollout (MuJoCo; Warp's CPU kernels run on one;
    Meta-World: its worker processes, each stepping its share of the environments)."""
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    """Where the ``isaaclab`` backend simulates and renders: ``cpu`` or ``cuda[:K]``."""
