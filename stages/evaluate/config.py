"""Typed configuration of the evaluation stage (the ``evaluate:`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim_scenes.tasks import resolve_task
from sim_scenes.touch import Phrasing


class SequentialConfig(BaseModel):
    """Sequential comparison with a baseline (``evaluate.sequential``): the candidate and the
    baseline play batches of the same seeds, and after each batch boundaries fixed before the
    first decide "worse", "not worse" or "continue" (:mod:`stages.evaluate.sequential`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    enabled: bool | None = None
    """None (default): on whenever there is a baseline (a champion); False: every seed, one
    test (the fixed design)."""
    looks: int = Field(default=10, ge=1, le=100)
    """Looks (batches) up to the maximum, ``evaluate.episodes`` seeds per variant."""
    spending: Literal["pocock", "obrien-fleming"] = "pocock"
    """Lan-DeMets error spending over the looks: Pocock-type stops earlier on average,
    O'Brien-Fleming-type keeps more of the error rate for the last look."""
    regression: float = Field(default=0.05, gt=0.0, le=1.0)
    """The regression (success-rate points, 0..1) the comparison must not miss: "not worse"
    is decided early only once a regression this large is ruled out."""
    power: float = Field(default=0.8, gt=0.5, lt=1.0)
    """Chance of catching a regression of ``regression`` (the miss rate is 1 - power), when
    ``evaluate.episodes`` is enough for it; the report says what the seeds used could
    detect."""


class DelayConfig(BaseModel):
    """Play the policy as a robot whose inference takes time (``evaluate.delay``; the rules are
    :mod:`stages.evaluate.delay`'s). With a delay, the policy at zero delay is the baseline of
    the paired comparison on the same seeds (no other baseline then)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    mode: Literal["sync", "async"] = "sync"
    """``sync``: the robot holds its safe action while an inference runs, then executes the
    chunk's first ``execute`` actions; ``async``: the runtime's asynchronous loop (chunks
    aligned to their observation's tick and blended, inference triggered ahead)."""
    inference_ms: float = Field(default=0.0, ge=0.0, le=600_000.0)
    """How long one inference takes, ms; 0 (default): no delay, today's evaluation."""
    latency_report: str | None = None
    """A latency gate's ``latency_report.json``: play its inference p99 (``inference_p99_ms``,
    else its tick ``p99_ms``) instead of ``inference_ms``."""
    margin_ms: float = Field(default=20.0, ge=0.0, le=60_000.0)
    """Added to the inference time before it is counted in ticks (the runtime's
    ``inference_margin_ms``: observation copies, scheduling)."""
    blend: Literal["linear", "none"] = "linear"
    """async: how a new chunk merges into the planned actions it overlaps
    (:class:`deploy_edge.async_loop.ChunkQueue`)."""
    blend_ticks: int | None = Field(default=None, ge=0, le=4096)
    """async: blend over at most this many overlapping ticks (None: the whole overlap)."""
    execute: int = Field(default=1, ge=1, le=4096)
    """sync: actions of each chunk executed before inferring again (1: today's receding
    horizon)."""

    @model_validator(mode="after")
    def _one_source(self) -> DelayConfig:
        if self.latency_report is not None and self.inference_ms > 0:
            raise ValueError(
                f"give inference_ms ({self.inference_ms:g}) or latency_report "
                f"({self.latency_report!r}), not both"
            )
        return self


class EvalConfig(BaseModel):
    """Which scenes, how many episodes, how parallel, and how strict the comparison gate is."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variants: list[str] | None = None
    """Scene variants of the suite; default: the held-out variants of ``scene.variant``."""
    phrasing: Phrasing = "trained"
    """How every variant's instructions are worded: ``trained`` (the phrasings training data
    uses) or ``unseen`` (templates and colour and shape synonyms no training instruction
    contains, :data:`sim_scenes.touch.UNSEEN_TEMPLATES`: does the policy understand words it
    never saw?); ``unseen-template``, ``unseen-colour`` and ``unseen-shape`` change only that
    part of the trained wording (which novelty does it fail on?); ``nonce``, ``absent`` and
    ``shuffled`` are corrupted controls, compared with chance: pseudowords for the colour and
    shape (does it find the target without reading?), a colour and shape on no object (is it
    led by the words?), the trained words in another order (does it need the order?)
    (:mod:`sim_scenes.touch_controls`). The same scenes and targets for the same seeds
    whatever the phrasing."""
    episodes: int = Field(default=100, ge=1, le=1_000_000)
    """Episodes per variant (seeds from the run's ``eval`` seed stream); with a baseline and
    sequential comparison, the maximum."""
    workers: int = Field(default=2, ge=0, le=1024)
    """Ray workers (one batched simulator + policy copy each); 0 evaluates in-process."""
    envs_per_worker: int = Field(default=16, ge=1, le=4096)
    """Environments each worker steps together (one batched inference per step)."""
    episodes_per_shard: int = Field(default=25, ge=1, le=100_000)
    """Episodes per unit of work: what a restarted worker plays again."""
    max_worker_restarts: int = Field(default=3, ge=0, le=1000)
    """Times Ray restarts each worker whose process dies (killed, out of memory); the shard it
    was playing is played again (same seeds, same outcomes). One more death stops the
    evaluation with ``WorkersDiedError``."""
    play_start: bool = True
    """The pipeline also plays the model fine-tuning started from (its base) on the suite, for
    the summary's "the model it started from" line. ``false`` skips it: on a suite where the
    base is known to fail (Meta-World MT10: ~12%), it is half the evaluation's time."""
    record_episodes: int = Field(default=2, ge=0, le=64)
    """Episodes per variant kept as frame strips (the first successes and failures)."""
    gate_confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """A candidate fails the gate only if it is worse than the baseline at this confidence
    (one-sided exact McNemar test on the shared seeds): the false-block rate is 1 - this,
    over all looks of a sequential comparison."""
    sequential: SequentialConfig = SequentialConfig()
    delay: DelayConfig = DelayConfig()
    """An inference delay to play (none by default), compared with zero delay."""

    @field_validator("variants")
    @classmethod
    def _known(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and not names:
            raise ValueError("an evaluation suite needs at least one variant")
        for name in names or []:
            resolve_task(name)  # its SceneError is a ValueError: pydantic reports the message
        return names
