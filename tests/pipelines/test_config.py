"""Config loading: every error names the source, field and value; resolved configs round-trip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.config import CONFIG_DIR, ConfigError, PipelineConfig, load_config, save_resolved

DEMO = CONFIG_DIR / "demo.yaml"


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(path: Path, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def test_every_shipped_config_loads() -> None:
    for path in CONFIG_DIR.glob("*.yaml"):
        assert isinstance(load_config(path), PipelineConfig)


def test_unknown_key_names_file_field_and_valid_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nsim:\n  num_env: 4\n")
    msg = problems(path)
    assert str(path) in msg
    assert "field 'sim.num_env' = 4: unknown field" in msg
    assert "valid fields here: backend, num_envs, num_threads" in msg


def test_wrong_type_names_file_field_and_value(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nsim:\n  num_envs: many\n")
    assert f"{path}: field 'sim.num_envs' = 'many': Input should be a valid integer" in problems(
        path
    )


def test_out_of_range_value(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nscene:\n  image_size: 4\n")
    assert "field 'scene.image_size' = 4: Input should be greater than or equal to 16" in problems(
        path
    )


def test_unknown_robot_and_variant_list_choices(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nrobot: ur5\nscene:\n  variant: touch-moon\n")
    msg = problems(path)
    assert "field 'robot' = 'ur5': unknown robot; valid choices: rp5, sawyer" in msg
    assert "field 'scene.variant' = 'touch-moon': unknown task 'touch-moon'; valid choices:" in msg
    path = write(tmp_path, "name: x\nexport:\n  variants: [int8, fp8]\n")
    assert "unknown export variant; valid choices: int8" in problems(path)


def test_the_task_names_its_family_robot_and_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scene.variant`` is ``[FAMILY/]VARIANT``: a bare name is a touch task, the robot follows
    the task, and a robot or backend the task cannot use is refused, naming both."""
    plain = load_config(write(tmp_path, "name: x\n"))
    spelled = load_config(write(tmp_path, "name: x\nscene:\n  variant: touch/touch-mixed\n"))
    assert plain.robot == spelled.robot == "rp5"
    assert "/" not in spelled.dataset_name() and "touch-touch-mixed" in spelled.dataset_name()
    assert plain.dataset_name().startswith("x-touch-mixed-"), "touch names are unchanged"
    msg = problems(write(tmp_path, "name: x\nscene:\n  variant: metaworld9/mt10\n"))
    assert "field 'scene.variant' = 'metaworld9/mt10': unknown task family 'metaworld9'" in msg

    mt10 = "name: x\nscene:\n  variant: metaworld/mt10\n  cameras: [corner2]\n"
    msg = problems(write(tmp_path, mt10 + "robot: rp5\nsim:\n  backend: metaworld\n"))
    assert (
        "field 'robot' = 'rp5': the task 'metaworld/mt10' (scene.variant) runs on robot 'sawyer'"
    ) in msg
    msg = problems(DEMO, ("scene.variant=metaworld/mt10", "robot=rp5"))
    assert "--set 'robot=rp5'" in msg
    # Unset, the robot is the task's; the backend and cameras must be the task's and robot's.
    msg = problems(write(tmp_path, mt10))
    assert "field 'sim.backend' = 'mujoco': the metaworld tasks play on metaworld" in msg
    on_metaworld = "sim:\n  backend: metaworld\n"
    msg = problems(write(tmp_path, mt10.replace("corner2", "scene") + on_metaworld))
    assert "field 'scene.cameras' = ['scene']: unknown camera 'scene' for robot 'sawyer'" in msg
    # Meta-World's success is its own: a radius is refused by name, not ignored.
    msg = problems(write(tmp_path, mt10 + "  success:\n    radius: 0.05\n" + on_metaworld))
    assert "scene.success: the metaworld tasks keep their own success (radius cannot be set)" in msg
    config = load_config(write(tmp_path, mt10 + on_metaworld))
    assert config.robot == "sawyer" and config.scene.task().name == "mt10"


def test_unknown_camera_lists_the_robots_cameras(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nscene:\n  cameras: [scene, top]\n")
    assert "unknown camera 'top' for robot 'rp5'; valid choices: scene, wrist" in problems(path)


def test_a_margin_at_or_above_the_regression_to_catch_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nregistry:\n  promotion:\n    margin: 0.05\n")
    assert (
        "field 'registry.promotion.margin' = 0.05: must be below evaluate.sequential.regression "
        "(0.05)"
    ) in problems(path)
    assert "--set 'registry.promotion.margin=0.2'" in problems(
        DEMO, ("registry.promotion.margin=0.2",)
    )
    ok = ("registry.promotion.margin=0.02", "evaluate.sequential.regression=0.1")
    assert load_config(DEMO, list(ok)).registry.promotion.margin == 0.02


def test_missing_file_lists_shipped_configs(tmp_path: Path) -> None:
    msg = problems(tmp_path / "nope.yaml")
    assert "nope.yaml: config file not found" in msg
    assert "demo.yaml" in msg


def test_invalid_yaml_and_non_mapping(tmp_path: Path) -> None:
    assert "not valid YAML" in problems(write(tmp_path, "name: [unclosed\n"))
    assert "top level must be a mapping" in problems(write(tmp_path, "- a\n- b\n", "list.yaml"))


def test_set_overrides_any_field_with_typed_values() -> None:
    cfg = load_config(DEMO, ["sim.num_envs=3", "scene.cameras=[scene, wrist]", "seed=5"])
    assert cfg.sim.num_envs == 3
    assert cfg.scene.cameras == ["scene", "wrist"]
    assert cfg.seed == 5


def test_bad_set_is_blamed_on_the_set_argument() -> None:
    assert "--set 'sim.num_envs=0': field 'sim.num_envs' = 0" in problems(DEMO, ("sim.num_envs=0",))
    assert "--set 'sim.gpus=1': field 'sim.gpus' = 1: unknown field" in problems(
        DEMO, ("sim.gpus=1",)
    )
    assert "expected FIELD=VALUE" in problems(DEMO, ("sim.num_envs",))


def test_extends_inherits_and_overrides(tmp_path: Path) -> None:
    base = write(tmp_path, "name: base\nsim:\n  num_envs: 8\n  num_threads: 1\n", "base.yaml")
    child = write(tmp_path, "extends: base.yaml\nname: child\nsim:\n  num_envs: 2\n", "child.yaml")
    cfg = load_config(child)
    assert (cfg.name, cfg.sim.num_envs, cfg.sim.num_threads) == ("child", 2, 1)
    assert base.exists()
    loop = write(tmp_path, "extends: loop.yaml\nname: x\n", "loop.yaml")
    assert "circular extends" in problems(loop)


def test_resolved_config_round_trips_and_hash_is_stable(tmp_path: Path) -> None:
    cfg = load_config(DEMO, ["sim.num_envs=5"])
    saved = save_resolved(cfg, tmp_path / "resolved.yaml")
    again = load_config(saved)
    assert again == cfg
    assert again.config_hash() == cfg.config_hash()
    assert load_config(DEMO).config_hash() != cfg.config_hash()


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("{name: n, flow: champion_regression}", "exactly one of cron and interval_s"),
        ("{name: n, flow: champion_regression, cron: '0 2 * *'}", "Invalid cron string"),
        (
            "{name: n, flow: champion_regression, cron: '0 2 * * *', timezone: Mars/Base}",
            "Mars/Base",
        ),
        ("{name: n, flow: retrain_everything, interval_s: 60}", "schedules.0.flow"),
    ],
)
def test_bad_schedules_are_named(entry: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(CONFIG_DIR / "demo.yaml", [f"schedules=[{entry}]"])


def test_demo_schedules_and_dataset_names() -> None:
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    assert {s.name: s.timezone for s in cfg.schedules} == {
        "nightly-retrain": "Europe/Berlin",
        "hourly-champion-check": "UTC",
    }
    assert cfg.model_name == "demo-policy"
    more = load_config(CONFIG_DIR / "demo.yaml", ["collect.episodes=5000"])
    other = load_config(CONFIG_DIR / "demo.yaml", ["seed=3"])
    assert more.dataset_name() == cfg.dataset_name(), "more episodes append to the same dataset"
    assert other.dataset_name() != cfg.dataset_name(), "another seed collects another dataset"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("Demo.v2 arm", "demo-v2-arm"), ("Greifer Ärm", "greifer-arm"), ("pick_place", "pick-place")],
)
def test_any_name_becomes_one_slug_for_files_keys_and_models(
    tmp_path: Path, name: str, expected: str
) -> None:
    """A name as a user types it: kept for display, its slug everywhere a backend is strict
    (Prefect artifact keys allow lowercase letters, digits and dashes only)."""
    cfg = load_config(write(tmp_path, f"name: {name}\n"))
    assert cfg.name == name and cfg.slug == expected
    assert cfg.model_name == f"{expected}-policy"
    assert cfg.dataset_name().startswith(f"{expected}-")
    assert re.fullmatch(r"[a-z0-9-]+", cfg.slug)


def test_a_name_without_letters_or_digits_is_refused() -> None:
    assert "name" in problems(DEMO, ("name=...",)) and "no letter or digit" in problems(
        DEMO, ("name=...",)
    )


def test_the_configs_the_readme_runs_load() -> None:
    """Every ``--config`` of a README command names a config that loads (the next steps too
    long to run in a test: an RL run, a variant, the schedules)."""
    from tests.test_docs import ROOT, commands_in

    readme = commands_in((ROOT / "README.md").read_text(), "README.md")
    named = [
        (c.where, c.words[i + 1])
        for c in readme
        for i, word in enumerate(c.words[:-1])
        if word in ("--config", "-c")
    ]
    assert len(named) >= 3, named
    for where, config in named:
        try:
            load_config(ROOT / config if config.startswith("configs/") else Path(config))
        except ConfigError as err:
            pytest.fail(f"{where}: {err}")
