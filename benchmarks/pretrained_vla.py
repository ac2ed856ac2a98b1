"""The pretrained VLA against the default one, on words and scenes neither was trained on.

Both policy types are fine-tuned, each with its shipped config (``configs/demo.yaml``,
``configs/pretrained.yaml``; ``--config`` gives both one), on the same demonstrations (the
demo's: ``collect.episodes`` of touch-mixed, scripted expert) -- the default VLA from its base
pretrained on the other variants
(``robo-pipe pretrain``), the ``pretrained`` type from ImageNet EfficientNet-Lite0 and the
all-MiniLM-L6-v2 sentence encoder (frozen, from their wheels) -- and then play the same held-out
seeds (the ``eval`` stream, never used for data) closed loop in MuJoCo:

- **trained phrasings**: touch-mixed as the demonstrations word it;
- **unseen phrasings**: the same scenes and targets, worded with templates, colour words and
  shape words no demonstration contains (``evaluate.phrasing: unseen``;
  :data:`sim_scenes.touch.UNSEEN_TEMPLATES`, ``COLOUR_SYNONYMS``, ``SHAPE_SYNONYMS``);
- **unseen-template / -colour / -shape**: only that part of the wording unseen (which novelty
  a type fails on);
- **shifted**: touch-mixed-shifted (stronger lighting and camera jitter), trained phrasings;
- **nonce / absent / shuffled**: the corrupted controls, against chance
  (:mod:`sim_scenes.touch_controls`): pseudowords for colour and shape (a policy that reads is
  at chance), a colour and shape on no object (one led by the words goes to what shares them:
  below chance), the trained words in another order (only a policy that needs the order loses
  the target);
- **all-trained / all-unseen-colour**: touch-mixed-all (every colour and shape, so every
  colour synonym is played), trained and unseen colour words.

For each: success with its 95% Wilson interval, and the paired exact McNemar p-value of the
difference on the same seeds (two-sided: twice the smaller one-sided p, capped at 1). Then the
language baselines of each type and suite (:mod:`stages.evaluate.language`): success where the
colour word is needed against a policy that ignores it (1 in the objects of the target's
shape), the same for the shape word, with the exact one-sided p-value of beating it, and each
control against chance (1 in the objects). Then:
demonstrations needed to reach 90% on trained phrasings (each type fine-tuned on the first N
episodes of the dataset, N in ``--demos``), fine-tune wall seconds (and the default's
pretraining, which it needs and the pretrained type does not), and the export's p99 of the whole
control step on ``local-cpu`` (the latency gate; FP32 graph) beside the pretrained type's
once-per-episode instruction encoding.

Goal (issue 39): on unseen phrasings the pretrained type >= 80% where the default is near
chance, with trained-phrasing success not significantly worse than the default's.

Run: ``python benchmarks/pretrained_vla.py [--quick] [--episodes N] [--demos 100,300,...]``.
``--episodes 100 --demos 300,1000,2000`` took about 60 minutes (over one restart) on 2 cores
shared with a CI run, from a home with nothing cached (docs/benchmarks.md has its figures);
``--quick``: 500 demonstrations, 400 BC steps, 600 pretraining steps, 50 episodes per suite,
no demonstrations sweep (about 9 minutes with the first six suites, before the controls and
touch-mixed-all were added; its policies barely train: it checks the pipeline, not success).
Uses ``$ROBO_PIPE_HOME`` (its caches make a second run fast). The last line is ``key=value``
pairs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipelines.config import CONFIG_DIR, PipelineConfig, load_config
from pipelines.home import home_dir
from pipelines.steps.collect import collect_dataset
from pipelines.steps.export import export_checkpoint
from pipelines.steps.latency import measure_latency
from pipelines.steps.training import finetune_policy, pretrain_base
from robots.spec import RobotSpec, get_robot
from sim_scenes.backends import make_env
from sim_scenes.episodes import play_episodes
from sim_scenes.seeds import episode_seeds
from sim_scenes.tasks import resolve_task
from sim_scenes.touch import Phrasing
from stages.evaluate.language import CONTROLS, LanguageBaselines, language_baselines
from stages.evaluate.policies import CheckpointPolicy
from stages.finetune.checkpoints import read_metrics
from stages.statistics import mcnemar_p_value, wilson_interval

TYPES = ("default", "pretrained")
SUITES: dict[str, tuple[str, Phrasing]] = {
    "trained": ("touch-mixed", "trained"),
    "unseen": ("touch-mixed", "unseen"),
    "unseen-template": ("touch-mixed", "unseen-template"),
    "unseen-colour": ("touch-mixed", "unseen-colour"),
    "unseen-shape": ("touch-mixed", "unseen-shape"),
    "shifted": ("touch-mixed-shifted", "trained"),
    "nonce": ("touch-mixed", "nonce"),
    "shuffled": ("touch-mixed", "shuffled"),
    "absent": ("touch-mixed", "absent"),
    "all-trained": ("touch-mixed-all", "trained"),
    "all-unseen-colour": ("touch-mixed-all", "unseen-colour"),
}
"""Suite label -> (scene variant, phrasing)."""
KEY_WORDS: dict[str, tuple[str, ...]] = {
    "trained": ("colour", "shape"),
    "unseen": ("colour", "shape"),
    "unseen-colour": ("colour",),
    "unseen-shape": ("shape",),
    "all-trained": ("colour",),
    "all-unseen-colour": ("colour",),
}
"""Suite label -> the word kinds whose success where needed (and p-value against ignoring the
word) the last line carries; the controls carry their p-value against chance."""


TYPE_CONFIGS = {"default": CONFIG_DIR / "demo.yaml", "pretrained": CONFIG_DIR / "pretrained.yaml"}
"""Each type as robo-pipe ships it: the demo's config, and configs/pretrained.yaml (the demo's
with ``policy.type: pretrained`` and its colour words, twice the fine-tuning steps)."""


def configure(base: Path | None, policy_type: str, overrides: list[str]) -> PipelineConfig:
    """``policy_type``'s shipped config (or ``base`` with ``policy.type`` set) with the
    benchmark's overrides."""
    if base is None:
        return load_config(TYPE_CONFIGS[policy_type], overrides)
    return load_config(base, [f"policy.type={policy_type}", *overrides])


def outcomes(
    cfg: PipelineConfig, checkpoint: str, variant: str, phrasing: Phrasing, seeds: list[int]
) -> tuple[np.ndarray, list[str]]:
    """Closed-loop success (bool per seed) of ``checkpoint`` on ``variant``, and each
    episode's failure mode (empty on success)."""
    policy = CheckpointPolicy(checkpoint, threads=2)
    scene = cfg.scene.model_copy(update={"variant": variant})
    family, task = resolve_task(variant)[0], scene.task(variant)
    env = make_env(get_robot(cfg.robot), scene, cfg.sim, autoreset=False, phrasing=phrasing)
    try:
        records = play_episodes(
            env,
            lambda _, obs: policy.predict_chunk(obs)[:, 0],
            seeds,
            signals=family.episode_signals,
        )
    finally:
        env.close()
    failures = [family.failure_mode(r.success, r.signals, task) for r in records]
    return np.array([r.success for r in records], dtype=bool), failures


def two_sided_p(candidate: np.ndarray, baseline: np.ndarray) -> float:
    """Exact McNemar, two-sided, on paired outcomes of the same seeds."""
    only_c = int(np.sum(candidate & ~baseline))
    only_b = int(np.sum(baseline & ~candidate))
    return min(1.0, 2 * min(mcnemar_p_value(only_c, only_b), mcnemar_p_value(only_b, only_c)))


def rate_text(hits: np.ndarray) -> str:
    low, high = wilson_interval(int(hits.sum()), len(hits))
    return f"{hits.mean():6.1%} [{low:.1%}, {high:.1%}]"


def language_of(
    results: dict[str, dict[str, tuple[np.ndarray, list[str]]]],
    seeds: list[int],
    robot: RobotSpec,
) -> dict[str, dict[str, LanguageBaselines]]:
    """Policy type -> suite label -> its language baselines (success and failure mode per
    seed in ``results``, in the order of ``seeds``)."""
    found: dict[str, dict[str, LanguageBaselines]] = {}
    for policy_type, suites in results.items():
        found[policy_type] = {}
        for label, (hits, failures) in suites.items():
            variant, phrasing = SUITES[label]
            baselines = language_baselines(variant, robot, seeds, hits.tolist(), phrasing, failures)
            assert baselines is not None, f"{variant} is a touch variant"
            found[policy_type][label] = baselines
    return found


def language_lines(language: dict[str, dict[str, LanguageBaselines]]) -> list[str]:
    """Per type and suite: success where the colour (shape) word is needed against a policy
    that ignores it, with the one-sided p-value of beating it; a control against chance."""
    lines = [
        "language baselines: success where the word is needed vs ignoring it (1 in the "
        "candidates it leaves), exact one-sided p; controls vs chance (1 in the objects)"
    ]
    for policy_type, suites in language.items():
        for label, lang in suites.items():
            if SUITES[label][1] in CONTROLS:
                rate = lang.successes / lang.episodes
                parts = [
                    f"{rate:.1%} vs chance {lang.chance:.1%} (p {lang.chance_p_value:.3g})",
                    f"went for an object in {lang.went_for_object}, the named one in "
                    f"{choice_share(lang):.1%} vs chance {lang.choice_chance:.1%} "
                    f"(p {lang.choice_p_value:.3g})",
                ]
            else:
                parts = [
                    f"{n.word} needed on {n.episodes}: {n.success_rate:.1%} vs ignore-{n.word} "
                    f"{n.ignore_baseline:.1%} (p {n.p_value:.3g})"
                    for n in lang.needed
                    if n.word in ("colour", "shape")
                ]
            lines.append(f"  {policy_type:<10} {label:<18} " + "; ".join(parts))
    return lines


def choice_share(lang: LanguageBaselines) -> float:
    """The named object's share of the episodes that went for an object (nan: none did)."""
    if not lang.went_for_object or lang.went_for_target is None:
        return float("nan")
    return lang.went_for_target / lang.went_for_object


def language_keys(language: dict[str, dict[str, LanguageBaselines]]) -> dict[str, str]:
    """The last line's language figures: per type and suite of :data:`KEY_WORDS` the success
    where each word is needed and its p-value against ignoring it, each control's p-value
    against chance, and the baselines of each variant (``ignore_colour_baseline``,
    ``ignore_shape_baseline``, ``chance``; touch-mixed-all's prefixed ``all_``)."""
    keys: dict[str, str] = {}
    for policy_type, suites in language.items():
        for label, lang in suites.items():
            for word in KEY_WORDS.get(label, ()):
                need = lang.kind(word)
                if need is not None:
                    keys[f"{policy_type}_{label}_{word}_needed"] = f"{need.success_rate:.3f}"
                    keys[f"p_{policy_type}_{label}_ignore_{word}"] = f"{need.p_value:.3g}"
            if SUITES[label][1] in CONTROLS:
                keys[f"p_{policy_type}_{label}_chance"] = f"{lang.chance_p_value:.3g}"
                keys[f"{policy_type}_{label}_chose_named"] = f"{choice_share(lang):.3f}"
                keys[f"{policy_type}_{label}_choice_chance"] = f"{lang.choice_chance:.3f}"
    for lang_by_suite in language.values():  # the baselines: the same for every type
        for label, lang in lang_by_suite.items():
            variant = SUITES[label][0].removeprefix("touch-mixed").strip("-")
            prefix = f"{variant}_" if variant else ""
            for word in ("colour", "shape"):
                need = lang.kind(word)
                if need is not None:
                    keys[f"{prefix}ignore_{word}_baseline"] = f"{need.ignore_baseline:.3f}"
            keys[f"{prefix}chance"] = f"{lang.chance:.3f}"
    return keys


def trained_seconds(checkpoint: str) -> float:
    """Wall seconds the training behind ``checkpoint`` took, from its logged metrics (the
    span of their timestamps, scaled to every step): a cached checkpoint reports the time it
    took when it ran."""
    logged = read_metrics(Path(checkpoint).parent)
    if len(logged) < 2:
        return float("nan")
    first, last = logged[0], logged[-1]
    span = last["time"] - first["time"]
    return span * last["step"] / max(1, last["step"] - first["step"])


def train(cfg: PipelineConfig) -> tuple[str, float, float]:
    """(checkpoint, pretraining seconds, fine-tuning seconds) for ``cfg``, cached in the home
    (the default VLA pretrains its base first; the pretrained type needs none)."""
    name = cfg.dataset_name()  # its key leaves out the episode count: one folder per count
    dataset = collect_dataset(cfg, out=home_dir("datasets") / f"{name}-{cfg.collect.episodes}")
    base = pretrain_base(cfg)
    ref = finetune_policy(cfg, dataset, base)
    pretrain_s = trained_seconds(base.path) if base is not None else 0.0
    return ref.path, pretrain_s, trained_seconds(ref.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, short runs")
    parser.add_argument("--episodes", type=int, default=200, help="episodes per suite")
    parser.add_argument("--demos", default="100,300,1000,2000", help="dataset sizes to sweep")
    parser.add_argument(
        "--config", type=Path, help="one config for both types (default: each type's shipped one)"
    )
    args = parser.parse_args()
    overrides = ["export.variants=[]"]  # FP32: the latency figure is the graph's own
    episodes, sizes = args.episodes, [int(n) for n in args.demos.split(",") if n]
    if args.quick:
        overrides += ["collect.episodes=500", "finetune.bc.steps=400", "pretrain.bc.steps=600"]
        episodes, sizes = 50, []

    demo = load_config(args.config or TYPE_CONFIGS["default"])
    seeds = episode_seeds(demo.seed, episodes, "eval")
    results: dict[str, dict[str, tuple[np.ndarray, list[str]]]] = {}
    timing: dict[str, tuple[float, float]] = {}
    latency: dict[str, dict[str, float]] = {}
    for policy_type in TYPES:
        cfg = configure(args.config, policy_type, overrides)
        checkpoint, pretrain_s, finetune_s = train(cfg)
        timing[policy_type] = (pretrain_s, finetune_s)
        print(f"{policy_type}: pretrain {pretrain_s:.0f} s, fine-tune {finetune_s:.0f} s")
        results[policy_type] = {
            label: outcomes(cfg, checkpoint, variant, phrasing, seeds)
            for label, (variant, phrasing) in SUITES.items()
        }
        for label, (hits, _) in results[policy_type].items():
            print(f"  {label:<16} {rate_text(hits)}")
        export = home_dir("exports") / f"bench-pretrained-vla-{policy_type}-{Path(checkpoint).name}"
        export_checkpoint(cfg, Path(checkpoint), export)
        report = measure_latency(cfg, export, export / "latency")
        latency[policy_type] = {
            "p99_ms": float(report.p99_ms),
            "instruction_ms": float(report.instruction_encode_p50_ms or 0.0),
        }

    to_90: dict[str, str] = {}
    for policy_type in TYPES:
        to_90[policy_type] = "none" if sizes else "not-measured"
        for n in sizes:
            cfg = configure(args.config, policy_type, [*overrides, f"collect.episodes={n}"])
            checkpoint, _, _ = train(cfg)
            hits, _ = outcomes(cfg, checkpoint, "touch-mixed", "trained", seeds[:100])
            print(f"{policy_type} with {n} demonstrations: trained phrasings {rate_text(hits)}")
            if hits.mean() >= 0.9:
                to_90[policy_type] = str(n)
                break

    print(f"\n{episodes} held-out seeds per suite, the same for both types")
    print(f"{'suite':<16} {'default':>26} {'pretrained':>26} {'paired p':>9}")
    pairs = {}
    for label in SUITES:
        d, p = results["default"][label][0], results["pretrained"][label][0]
        pairs[label] = two_sided_p(p, d)
        print(f"{label:<16} {rate_text(d):>26} {rate_text(p):>26} {pairs[label]:>9.3g}")
    language = language_of(results, seeds, get_robot(demo.robot))
    print("\n".join(language_lines(language)))
    for policy_type in TYPES:
        pre, fine = timing[policy_type]
        print(
            f"{policy_type}: pretrain {pre:.0f} s, fine-tune {fine:.0f} s, p99 control step "
            f"{latency[policy_type]['p99_ms']:.1f} ms, instruction encoding once per episode "
            f"{latency[policy_type]['instruction_ms']:.1f} ms, demonstrations to 90%: "
            f"{to_90[policy_type]}"
        )
    line = {f"{t}_{label}": f"{results[t][label][0].mean():.3f}" for t in TYPES for label in SUITES}
    line |= {f"p_{label}": f"{pairs[label]:.3g}" for label in SUITES}
    line |= {f"{t}_finetune_s": f"{timing[t][1]:.0f}" for t in TYPES}
    line |= {"default_pretrain_s": f"{timing['default'][0]:.0f}"}
    line |= {f"{t}_p99_ms": f"{latency[t]['p99_ms']:.1f}" for t in TYPES}
    line |= {"pretrained_instruction_ms": f"{latency['pretrained']['instruction_ms']:.1f}"}
    line |= {f"{t}_demos_to_90": to_90[t] for t in TYPES}
    line |= language_keys(language)
    line |= {"episodes": str(episodes)}
    print(" ".join(f"{k}={v}" for k, v in line.items()))


if __name__ == "__main__":
    main()
