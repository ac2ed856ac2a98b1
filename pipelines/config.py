"""Pipeline configs: YAML files in ``configs/`` loaded into one typed, validated model.

A config file may start from another with ``extends: other.yaml`` (a path relative to the file)
and change only what differs; ``--set a.b=c`` overrides any field after that. Values given to
``--set`` are parsed as YAML, so ``--set sim.num_envs=8`` is an int and ``--set
scene.cameras=[scene,wrist]`` a list.

Every error names where the bad value came from (the file, or the ``--set`` argument), the field
and the value. The fully resolved config, saved with every run (:func:`save_resolved`), loads
back to an identical config: it is enough to reproduce the run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from configs import config_dir
from robo_pipe.errors import RoboPipeError
from robo_pipe.names import slug
from robots.spec import available_robots, get_robot
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.errors import SceneError
from sim_scenes.tasks import resolve_task
from stages.collect.config import CollectConfig
from stages.demo.config import DemoConfig
from stages.evaluate.config import EvalConfig
from stages.export.config import ExportConfig
from stages.finetune.config import FinetuneConfig, PretrainConfig
from stages.policy.config import PolicyConfig
from stages.policy.types import policy_type
from stages.register.config import PromotionConfig

CONFIG_DIR = config_dir()


class ConfigError(RoboPipeError, ValueError):
    """A config could not be loaded; ``problems`` holds one line per bad field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class LatencyGateConfig(BaseModel):
    """The pipeline's latency gate: the exported policy in the control loop on this machine."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    target: str = "local-cpu"
    """Target profile: a name in ``configs/targets/`` or a YAML path (engine, rate, budget)."""
    budget_ms: float | None = Field(default=None, gt=0)
    """p99 budget of one control step in ms; default: the target profile's."""
    steps: int = Field(default=300, ge=1, le=1_000_000)
    """Measured control steps (paced at the control rate: 300 steps at 10 Hz take 30 s)."""
    warmup: int = Field(default=30, ge=0, le=100_000)
    """Unmeasured steps first."""
    pace: bool = True
    """Sleep to the control rate between steps, as on the robot."""
    sweep: bool = False
    """Then play the evaluation suite at inference delays of 0-16 control ticks and at the
    measured p99's, sync and async, on the same seeds (:mod:`stages.evaluate.sweep`): the
    run summary's "success against inference delay" (``robo-pipe gate --sweep``). About ten
    evaluations' worth of episodes."""


class RegistryConfig(BaseModel):
    """The MLflow model registry the pipeline registers exported policies in."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model_name: str | None = Field(default=None, min_length=1, pattern=r"^[A-Za-z0-9][\w.-]*$")
    """Registered model name; default ``<name>-policy``."""
    promotion: PromotionConfig = PromotionConfig()


class DeployConfig(BaseModel):
    """The pipeline's last stage: the new champion onto an edge device."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    local_agent: bool = False
    """Deploy a newly promoted champion to a local edge agent on 127.0.0.1 (started for the
    stage and stopped after it; its state, key and token under ``$ROBO_PIPE_HOME``), then run
    one episode on it. Gate and health use the ``latency`` section's steps and pacing."""
    episode_ticks: int = Field(default=100, ge=1, le=100_000)
    """Control ticks of the episode run on the device after the deployment."""
    fleet: str | None = None
    """A fleet file: after the pipeline promotes a new champion, roll it out to that fleet
    (canary, waves, abort threshold: the file's rollout policy), e.g. after the nightly
    retrain. The devices' token variables must be set where the pipeline runs."""


class ScheduleConfig(BaseModel):
    """One Prefect deployment ``robo-pipe serve`` registers and serves."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][\w.-]*$")
    """Deployment name (shown in the Prefect UI)."""
    flow: Literal["train_simulate_deploy", "champion_regression"]
    """``train_simulate_deploy``: the whole pipeline (e.g. a nightly retrain);
    ``champion_regression``: evaluate the current champion on the held-out suite."""
    cron: str | None = None
    """Cron string, e.g. ``"0 2 * * *"`` (02:00 every day) in ``timezone``."""
    interval_s: float | None = Field(default=None, gt=0)
    """Run every this many seconds instead of on a cron."""
    timezone: str = "UTC"
    """IANA time zone of the cron string, e.g. ``Europe/Berlin``."""
    set: list[str] = []
    """``FIELD=VALUE`` overrides applied to this config for the scheduled runs."""

    @model_validator(mode="after")
    def _one_schedule(self) -> ScheduleConfig:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give exactly one of cron and interval_s")
        if self.cron is not None:  # Prefect's own check (imported only when a cron is given)
            from prefect.schedules import Cron

            Cron(self.cron)
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {self.timezone!r} (IANA names)") from None
        return self


class PipelineConfig(BaseModel):
    """A whole robo-pipe run: robot, task, simulator and the settings of each stage."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1)
    """Run name, as you like it (``Demo.v2 arm``): shown as typed; its :attr:`slug` names run
    folders, datasets, checkpoints, Prefect artifacts and the default registry model."""
    seed: int = Field(default=0, ge=0, lt=2**31)
    """Root seed; every random choice of the run derives from it."""
    robot: str = "rp5"
    """Robot name (``robo-pipe robots`` lists them); unset, the task's (``scene.variant``)."""
    scene: SceneConfig = SceneConfig()
    sim: SimConfig = SimConfig()
    demo: DemoConfig = DemoConfig()
    collect: CollectConfig = CollectConfig()
    policy: PolicyConfig = PolicyConfig()
    pretrain: PretrainConfig = PretrainConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    export: ExportConfig = ExportConfig()
    evaluate: EvalConfig = EvalConfig()
    latency: LatencyGateConfig = LatencyGateConfig()
    registry: RegistryConfig = RegistryConfig()
    deploy: DeployConfig = DeployConfig()
    schedules: list[ScheduleConfig] = []
    """Deployments ``robo-pipe serve`` registers (e.g. a nightly retrain)."""

    @model_validator(mode="before")
    @classmethod
    def _robot_of_the_task(cls, data: Any) -> Any:
        """An unset ``robot`` is the one the task runs on (rp5 for touch: the same resolved
        config, and hash, as before tasks had robots)."""
        if not isinstance(data, dict) or "robot" in data:
            return data
        scene = data.get("scene", {})
        variant = scene.get("variant") if isinstance(scene, dict) else scene.variant
        try:
            family, _ = resolve_task(variant or SceneConfig().variant)
        except SceneError:
            return data  # scene.variant's own check names it
        return {**data, "robot": family.robot}

    @field_validator("robot")
    @classmethod
    def _known_robot(cls, name: str) -> str:
        if name not in available_robots():
            raise ValueError(f"unknown robot; valid choices: {', '.join(available_robots())}")
        return name

    @field_validator("name")
    @classmethod
    def _has_a_slug(cls, name: str) -> str:
        if not slug(name):
            raise ValueError(f"{name!r} has no letter or digit to name files and keys after")
        return name

    @property
    def slug(self) -> str:
        """:attr:`name` as keys and file names take it (``Demo.v2 arm`` -> ``demo-v2-arm``)."""
        return slug(self.name)

    @property
    def model_name(self) -> str:
        """The registered model name (``registry.model_name`` or ``<slug>-policy``)."""
        return self.registry.model_name or f"{self.slug}-policy"

    def dataset_name(self) -> str:
        """The collected dataset's folder under ``$ROBO_PIPE_HOME/datasets``:
        ``<slug>-<variant>-<key>``, the key hashing everything that decides its content except
        the episode count (so a larger ``collect.episodes`` appends to the same dataset) and
        the workers."""
        what = self.model_dump(include={"robot", "seed"}, mode="json")
        what["scene"] = self.scene.model_dump(mode="json", exclude={"success", "episode_steps"})
        what.update(self.scene.task_overrides())  # absent when unset: older keys stay valid
        # Neither how many episodes nor how they are spread over workers (and how often a dead
        # one is restarted) changes the episodes of a seed.
        ignored = {"episodes", "workers", "max_worker_restarts"}
        if not self.collect.action_noise:
            ignored.add("action_noise")  # absent when unset: older keys stay valid
        what["collect"] = self.collect.model_dump(mode="json", exclude=ignored)
        digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.slug}-{slug(self.scene.variant)}-{digest}"

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of the resolved config (first 16 hex digits)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def shipped_config(path: Path) -> Path:
    """``path``, or the shipped config of that name when ``path`` is ``NAME.yaml`` or
    ``configs/NAME.yaml`` and no such file is here (an installed robo-pipe, run anywhere)."""
    if path.exists() or path.parent not in (Path("."), Path("configs")):
        return path
    shipped = CONFIG_DIR / path.name
    return shipped if shipped.is_file() else path


def available_configs() -> list[str]:
    """Config files shipped in ``configs/``."""
    return sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))


def _read_yaml(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    if not path.is_file():
        hint = f"; configs in {CONFIG_DIR}: {', '.join(available_configs())}"
        raise ConfigError([f"{path}: config file not found{hint}"])
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML: {err}"]) from err
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{path}: top level must be a mapping of fields, got {type(data).__name__}"]
        )
    parent = data.pop("extends", None)
    if parent is None:
        return data
    parent_path = (path.parent / str(parent)).resolve()
    if parent_path in chain:
        raise ConfigError([f"{path}: field 'extends' = {parent!r}: circular extends"])
    return _deep_merge(_read_yaml(parent_path, (*chain, path.resolve())), data)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _apply_override(data: dict[str, Any], override: str) -> str:
    """Apply one ``a.b=c`` override in place; return the dotted field it set."""
    field, sep, raw = override.partition("=")
    field = field.strip()
    if not sep or not field or any(not part for part in field.split(".")):
        raise ConfigError([f"--set {override!r}: expected FIELD=VALUE, e.g. sim.num_envs=8"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    node = data
    parts = field.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value
    return field


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> PipelineConfig:
    """Load ``path``, apply ``--set`` style ``overrides``, validate, and return the config.

    Raises:
        ConfigError: missing file, invalid YAML, unknown field, wrong type or out-of-range
            value; each problem names its source (file or ``--set``), field and value.
    """
    path = shipped_config(Path(path))
    data = _read_yaml(path)
    set_by: dict[str, str] = {}
    for override in overrides:
        set_by[_apply_override(data, override)] = override

    def source(loc: str) -> str:
        for field, override in set_by.items():
            if loc == field or loc.startswith(field + ".") or field.startswith(loc + "."):
                return f"--set {override!r}"
        return str(path)

    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "unknown field" + _suggest_fields(e["loc"])
            value = e.get("input")
            problems.append(f"{source(loc)}: field '{loc}' = {value!r}: {msg}")
        raise ConfigError(problems) from err
    # Checks that need more than one field.
    margin, regression = config.registry.promotion.margin, config.evaluate.sequential.regression
    if margin >= regression:
        raise ConfigError(
            [
                f"{source('registry.promotion.margin')}: field 'registry.promotion.margin' = "
                f"{margin!r}: must be below evaluate.sequential.regression ({regression:g}): a "
                "sequential comparison passes early only once a regression that large is ruled "
                "out"
            ]
        )
    family, _ = resolve_task(config.scene.variant)
    if config.robot != family.robot:
        raise ConfigError(
            [
                f"{source('robot')}: field 'robot' = {config.robot!r}: the task "
                f"{config.scene.variant!r} (scene.variant) runs on robot {family.robot!r}; "
                "leave robot unset to take the task's"
            ]
        )
    if config.sim.backend not in family.backends:
        raise ConfigError(
            [
                f"{source('sim.backend')}: field 'sim.backend' = {config.sim.backend!r}: the "
                f"{family.name} tasks play on {', '.join(family.backends)}"
            ]
        )
    known = [c.name for c in get_robot(config.robot).cameras]
    unknown = [c for c in config.scene.cameras if c not in known]
    if unknown:
        raise ConfigError(
            [
                f"{source('scene.cameras')}: field 'scene.cameras' = {config.scene.cameras!r}: "
                f"unknown camera {unknown[0]!r} for robot {config.robot!r}; valid choices: "
                f"{', '.join(known)}"
            ]
        )
    rl_from_base = config.finetune.is_rl and config.finetune.warm_start == "none"
    if rl_from_base and not policy_type(config.policy.type).needs_pretraining:
        raise ConfigError(
            [
                f"{source('finetune.warm_start')}: field 'finetune.warm_start' = 'none': RL from "
                f"the base's fresh adapters needs policy.type default, not {config.policy.type!r}"
            ]
        )
    if config.scene.variant in (config.pretrain.variants or []):
        raise ConfigError(
            [
                f"{source('pretrain.variants')}: field 'pretrain.variants' = "
                f"{config.pretrain.variants!r}: includes the target variant "
                f"{config.scene.variant!r} (scene.variant); the base must not see the target task"
            ]
        )
    return config


def _suggest_fields(loc: tuple[int | str, ...]) -> str:
    model: type[BaseModel] = PipelineConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    return f"; valid fields here: {', '.join(model.model_fields)}"


def save_resolved(config: PipelineConfig, path: Path) -> Path:
    """Write the fully resolved config as YAML (loadable by :func:`load_config`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
    path.write_text(f"# resolved robo-pipe config, hash {config.config_hash()}\n{body}")
    return path
