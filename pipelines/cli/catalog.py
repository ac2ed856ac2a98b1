"""What there is to choose from: ``config`` (a resolved config), ``robots``, ``scenes``."""

from __future__ import annotations

from dataclasses import asdict

import typer
from rich.table import Table

from pipelines.cli.common import emit_json, load, result_console
from pipelines.cli.options import DEMO_CONFIG, ConfigOpt, JsonOpt, SetOpt, add_verb
from robots.spec import available_robots, get_robot
from sim_scenes.tasks import TASKS, task_family, task_name


def config(config: ConfigOpt = DEMO_CONFIG, set_: SetOpt = None) -> None:
    """Validate a config and print it fully resolved (extends and --set applied) as YAML.

    A shipped config can be named without its folder: robo-pipe config -c tiny.yaml."""
    import yaml

    cfg = load(config, set_)
    print(f"# config hash {cfg.config_hash()}")
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")


def robots(json_out: JsonOpt = False) -> None:
    """List robots with their joints and limits, cameras, control rate and action space."""
    records, out = [], result_console(json_out)
    for name in available_robots():
        spec = get_robot(name)
        table = Table(title=f"{name}: {spec.description}")
        for col in ("action component", "kind", "range", "unit"):
            table.add_column(col)
        action = spec.action
        for comp, kind, low, high, unit in zip(
            action.names, action.kinds, action.low, action.high, action.units, strict=True
        ):
            table.add_row(comp, kind, f"[{low:g}, {high:g}]", unit)
        out.print(table)
        control = f"{spec.control_hz:g} Hz"
        if spec.definition is not None:  # compiled from MJCF: its joints and physics steps
            joints = ", ".join(f"{j.name} [{j.low:g}, {j.high:g}]" for j in spec.arm + spec.gripper)
            out.print(f"  joints: {joints}", highlight=False)
            control += f" ({spec.substeps} physics steps)"
        out.print(
            f"  control: {control}; cameras: {', '.join(c.name for c in spec.cameras)}; "
            f"state: {', '.join(spec.state_names)}",
            highlight=False,
        )
        records.append(
            {
                "name": name,
                "control_hz": spec.control_hz,
                "cameras": [c.name for c in spec.cameras],
                "action": asdict(spec.action),
                "state": list(spec.state_names),
            }
        )
    emit_json(records, json_out)


def scenes(json_out: JsonOpt = False) -> None:
    """List every task (scene.variant) by family, with the robot it runs on; held-out variants
    are reserved for evaluation."""
    out, records = result_console(json_out), []
    for family in map(task_family, TASKS):
        table = Table(title=f"{family.name} tasks (robot {family.robot}): {family.description}")
        names = family.variant_names()
        columns = list(family.describe(names[0])) if names else ["description"]
        for col in ("scene.variant", "split", *columns):
            table.add_column(col)
        for name in names:
            variant = family.variant(name)
            split = variant.split
            if variant.holdout_for is not None:
                split = f"{split} (for {task_name(family, variant.holdout_for)})"
            table.add_row(task_name(family, name), split, *family.describe(name).values())
            records.append(
                {
                    "name": task_name(family, name),
                    "family": family.name,
                    "robot": family.robot,
                    "split": variant.split,
                }
            )
        out.print(table)
    emit_json(records, json_out)


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        app,
        config,
        "robo-pipe config",
        "robo-pipe config --config configs/tiny.yaml --set sim.num_envs=8",
    )
    add_verb(app, robots, "robo-pipe robots", "robo-pipe robots --json")
    add_verb(app, scenes, "robo-pipe scenes", "robo-pipe scenes --json")
