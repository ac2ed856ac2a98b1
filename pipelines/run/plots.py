"""The run summary's plots: the training curves, and a PNG inline as a ``data:`` URI (what an
image in a Prefect markdown artifact can be)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

from stages.finetune.checkpoints import read_metrics

if TYPE_CHECKING:
    from stages.policy.checkpoint import CheckpointRef


def plot_training_curves(checkpoints: dict[str, CheckpointRef | None], out: Path) -> Path | None:
    """Action loss against step for each BC checkpoint (``{"pretrain": ref, ...}``); for an RL
    one, the rolling success of its training episodes against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Here, not at the top: stages.finetune.rl loads torch and peft (3 s), and every fleet
    # command imports this module for its artifact.
    from stages.finetune.rl import rolling_success

    curves = {
        stage: read_metrics(Path(ref.path).parent) for stage, ref in checkpoints.items() if ref
    }
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.2), squeeze=False)
    for ax, (stage, records) in zip(axes[0], curves.items(), strict=True):
        if "env_steps" in records[0]:  # RL fine-tuning: success of its training episodes
            steps = [r["env_steps"] for r in records]
            ax.plot(steps, rolling_success(records), label="training-episode success")
            ax.set_title(f"{stage} (RL, {records[-1]['env_steps_per_s']:,.0f} env-steps/s)")
            ax.set(xlabel="env steps", ylabel="success", ylim=(-0.02, 1.02))
        else:
            steps = [r["step"] for r in records]
            ax.plot(steps, [r["action_loss"] for r in records], label="action NLL")
            if "aux_loss" in records[0]:
                ax.plot(steps, [r["aux_loss"] for r in records], label="aux (object xy)", alpha=0.7)
            ax.set_title(f"{stage} ({records[-1]['samples_per_s']:,.0f} samples/s)")
            ax.set(xlabel="step", ylabel="loss")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def data_uri(png: Path) -> str:
    """``png`` inline, as a ``data:`` URI (what an image in a Prefect markdown artifact can be)."""
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
