"""VLAs at the size people deploy, on this CPU: export, INT8, accuracy, latency, the engine
``precision: auto`` picks, and the release at 250 M parameters.

For the default VLA (the demo's size) and the ``hub-vlm`` presets ``smolvlm-256m``,
``smolvlm-500m`` (SmolVLM-256M/500M architectures; random weights: systems measurements only),
in one run (``--models 1b`` adds ``idefics3-1b``, 1.18 B: its export alone takes ~12 min at a
10 GiB peak):

- parameters; the export through ``robo-pipe export`` in its own process (graph, INT8 variant
  calibrated on dataset frames, parity and scoring): wall seconds and the process's peak RSS, as
  the export records them, and that peak over the FP32 weights' size; ONNX MB (FP32 and INT8,
  with external data);
- ONNX Runtime per-inference latency of the FP32 graph and its INT8 variant (static Q/DQ,
  per-channel weights; symmetric INT8 activations, the graph TensorRT builds from, and at 256 M
  also asymmetric uint8 activations, ``256m-u8``, for CPU targets) at batch 1, at 1 and 2
  threads: p50/p99 over ``--iterations`` after two warm-ups, the FP32 and INT8 runs
  interleaved in the same process (the INT8 speed-up is a ratio within one run);
- INT8 action error against FP32 on held-out dataset frames (as the export scored it), relative
  to each action dimension's std;
- for ``hub-vlm``, what encoding the instruction once per episode would save: the language
  model's eager forward with and without the instruction's tokens (the most a cached instruction
  prefix could save), beside the whole inference;
- the variant ``precision: auto`` picks on ``local-cpu`` (100 ms budget at p99): each candidate's
  whole-control-step p99 in the gate, and the choice or the refusal;
- the default VLA's held-out success with INT8 against FP32 on the same seeds (paired test), when
  ``--checkpoint`` names a trained default VLA and ``--dataset`` its dataset;
- at 250 M (full run only): the signed release's size and a deploy to a local agent
  (``--systems-test``): upload, verify, extract, engine, parity and gate seconds.

``--quick``: the default VLA and the ``tiny`` preset (seconds each); no 250 M deploy.

Run: ``python benchmarks/vla_scale.py [--quick] [--checkpoint DIR --dataset DIR]``; the last
line is ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from deploy_edge.bundle.files import model_files
from deploy_edge.bundle.io_spec import IOSpec, read_io_spec
from deploy_edge.bundle.layout import REFERENCE_FILE
from deploy_edge.engines import OnnxRuntimeEngine
from pipelines.config import CONFIG_DIR, PipelineConfig, load_config

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "default": ("demo.yaml", []),
    "tiny": ("demo.yaml", ["policy.type=hub-vlm", "policy.preset=tiny", "policy.weights=random"]),
    "256m": ("vla-256m.yaml", []),
    "256m-u8": ("vla-256m.yaml", ["export.int8_activations=asymmetric"]),
    "500m": ("vla-500m.yaml", []),
    "1b": ("vla-1b.yaml", []),
}
"""Benchmark label -> (shipped config, overrides)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="default VLA and the tiny preset")
    parser.add_argument("--iterations", type=int, help="timed inferences per engine (default 20)")
    parser.add_argument("--checkpoint", type=Path, help="a trained default VLA checkpoint")
    parser.add_argument("--dataset", type=Path, help="its dataset (calibration and scoring)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), help="only these models")
    args = parser.parse_args()
    # 1b only when named (--models 1b): its export alone takes ~12 minutes at a 10 GiB peak
    # on this 24 GiB machine (docs/vla-at-size.md), and its FP32 inference seconds a step.
    full = ["default", "256m", "256m-u8", "500m"]
    labels = args.models or (["default", "tiny"] if args.quick else full)
    iterations = args.iterations or (5 if args.quick else 20)
    figures: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dataset = args.dataset or small_dataset(root / "dataset")
        for label in labels:
            name, overrides = MODELS[label]
            cfg = load_config(CONFIG_DIR / name, overrides)
            checkpoint = (
                args.checkpoint
                if label == "default" and args.checkpoint
                else fresh_checkpoint(cfg, root / f"{label}-ckpt")
            )
            export_dir = root / f"{label}-export"
            exported = export_in_subprocess(checkpoint, export_dir, dataset, name, overrides)
            print(f"\n{label}: {exported.parameters / 1e6:.1f} M parameters", flush=True)
            weights_mb = exported.parameters * 4 / 2**20  # FP32
            figures[f"{label}_export_rss_x_weights"] = (
                f"{exported.export_peak_rss_mb / weights_mb:.2f}"
            )
            figures |= {f"{label}_{k}": v for k, v in model_figures(export_dir, iterations).items()}
            if label != "256m-u8":  # its model is 256m's
                figures |= {f"{label}_{k}": v for k, v in instruction_once(checkpoint).items()}
            steps = 20 if label in ("default", "tiny") else 5
            auto = auto_choice(export_dir, steps, root / f"{label}-latency")
            figures |= {f"{label}_{k}": v for k, v in auto.items()}
            if label == "256m":
                deployed = deploy_at_size(export_dir, root, label)
                figures |= {f"{label}_{k}": v for k, v in deployed.items()}
        if args.checkpoint and args.dataset:
            figures |= int8_success(args.checkpoint, args.dataset, root, args.quick)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


def small_dataset(out: Path) -> Path:
    """8 expert episodes of the demo task (its 64 px scene camera) for calibration and scoring."""
    from stages.collect import collect

    cfg = load_config(CONFIG_DIR / "demo.yaml", ["collect.episodes=8", "collect.workers=0"])
    return Path(collect(cfg.robot, cfg.scene, cfg.sim, cfg.collect, cfg.seed, out).path)


def fresh_checkpoint(cfg: PipelineConfig, out: Path) -> Path:
    """A freshly initialised policy of ``cfg``'s size (the same graph and cost as a trained
    one)."""
    from stages.policy.checkpoint import save_new_policy

    return Path(save_new_policy(cfg.policy, cfg.scene.cameras, cfg.scene.image_size, out))


def export_in_subprocess(
    checkpoint: Path, out: Path, dataset: Path, config: str, overrides: list[str]
) -> IOSpec:
    """``robo-pipe export`` in its own process (its peak RSS is the export's alone)."""
    sets = [arg for o in overrides for arg in ("--set", o)]
    command = [sys.executable, "-m", "pipelines.cli", "export", str(checkpoint)]
    command += ["--out", str(out), "--dataset", str(dataset), "-c", config, *sets]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"export failed ({done.returncode}):\n{done.stderr[-4000:]}")
    spec = read_io_spec(out)
    print(
        f"export: {spec.export_seconds:.1f} s in the stage ({time.perf_counter() - start:.1f} s "
        f"with start-up), peak RSS {spec.export_peak_rss_mb:.0f} MiB",
        flush=True,
    )
    return spec


def _mb(files: list[Path]) -> float:
    return sum(f.stat().st_size for f in files) / 2**20


def model_figures(export_dir: Path, iterations: int) -> dict[str, str]:
    """Sizes, per-inference latency of FP32 and INT8 at 1 and 2 threads, INT8 error."""
    spec = read_io_spec(export_dir)
    int8 = spec.variant("int8")
    files = {"fp32": export_dir / spec.onnx_file}
    if int8 is not None:
        files["int8"] = export_dir / int8.onnx_file
    figures = {
        "params_m": f"{spec.parameters / 1e6:.1f}",
        "export_s": f"{spec.export_seconds:.1f}",
        "export_peak_rss_mb": f"{spec.export_peak_rss_mb:.0f}",
    }
    for name, file in files.items():
        figures[f"{name}_onnx_mb"] = f"{_mb(model_files(export_dir, file.name)):.1f}"
    with np.load(export_dir / REFERENCE_FILE, allow_pickle=False) as data:
        feeds = {n: data[n][:1] for n in spec.input_names}
    print(f"{'engine':<6} {'threads':>7} {'p50 ms':>9} {'p99 ms':>9}")
    for threads in (1, 2):
        engines = {n: OnnxRuntimeEngine(f, threads=threads) for n, f in files.items()}
        times: dict[str, list[float]] = {n: [] for n in engines}
        for engine in engines.values():
            for _ in range(2):  # warm-up
                engine.run(feeds)
        for _ in range(iterations):  # interleaved: load on the machine hits both alike
            for name, engine in engines.items():
                start = time.perf_counter()
                engine.run(feeds)
                times[name].append((time.perf_counter() - start) * 1000.0)
        for name, ms in times.items():
            p50, p99 = np.percentile(ms, [50, 99])
            print(f"{name:<6} {threads:>7} {p50:>9.1f} {p99:>9.1f}", flush=True)
            figures[f"{name}_t{threads}_p50_ms"] = f"{p50:.1f}"
            figures[f"{name}_t{threads}_p99_ms"] = f"{p99:.1f}"
        if "int8" in times:
            speedup = np.median(times["fp32"]) / np.median(times["int8"])
            figures[f"int8_speedup_t{threads}"] = f"{speedup:.2f}"
    if int8 is not None:
        figures["int8_rel_error"] = f"{int8.relative_error:.4f}"
        figures["int8_abs_error"] = f"{int8.action_error:.2e}"
        figures["int8_candidate"] = str(int8.candidate).lower()
        print(
            f"int8: error {int8.action_error:.2e} robot units, {int8.relative_error:.2%} of the "
            f"action std (worst dimension) on {int8.scored_frames} held-out frames; "
            f"candidate: {int8.candidate} {int8.reason}",
            flush=True,
        )
    return figures


def instruction_once(checkpoint: Path, iterations: int = 5) -> dict[str, str]:
    """The language model's forward with and without the instruction's tokens (eager, 1 thread):
    the most encoding the instruction once per episode (a cached prefix) could save."""
    import torch

    from stages.policy.checkpoint import load_policy
    from stages.policy.hub_vla import HubVLA

    torch.set_num_threads(1)
    policy = load_policy(checkpoint).eval()
    if not isinstance(policy, HubVLA):  # no language-model backbone: nothing to measure
        return {}
    cfg, config = policy.cfg, policy.backbone.config
    lm = policy.backbone.text_model
    width = int(config.text_config.hidden_size)
    per_camera = (policy.vision_size // config.vision_config.patch_size) ** 2
    image_tokens = per_camera // config.scale_factor**2 * len(cfg.cameras)
    rest = image_tokens + 1 + cfg.chunk_len  # image tokens, the state token, action queries
    full = torch.randn(1, rest + cfg.max_tokens, width)
    without = full[:, :rest]

    times: dict[int, list[float]] = {0: [], 1: []}
    with torch.no_grad():
        for i in range(iterations + 1):  # interleaved; the first round warms up
            for which, sequence in enumerate((full, without)):
                start = time.perf_counter()
                lm(inputs_embeds=sequence)
                if i:
                    times[which].append((time.perf_counter() - start) * 1000.0)
    with_ms, without_ms = (float(np.median(times[k])) for k in (0, 1))
    print(
        f"language model: {with_ms:.1f} ms with the {cfg.max_tokens} instruction tokens, "
        f"{without_ms:.1f} ms without (a cached instruction saves at most "
        f"{with_ms - without_ms:.1f} ms per inference)",
        flush=True,
    )
    return {"lm_ms": f"{with_ms:.1f}", "lm_without_instruction_ms": f"{without_ms:.1f}"}


def auto_choice(export_dir: Path, steps: int, out: Path) -> dict[str, str]:
    """The variant ``precision: auto`` picks on ``local-cpu-auto`` (ONNX Runtime, 1 thread,
    100 ms at p99): the pipeline's latency step (:func:`pipelines.steps.latency.measure_latency`) on
    that profile, every option gated for ``steps`` unpaced control steps of the simulated
    robot, then the device's rule (:func:`deploy_edge.precision.choose_variant`)."""
    from pipelines.steps.latency import measure_latency

    gate = ["latency.target=local-cpu-auto", f"latency.steps={steps}", "latency.warmup=2"]
    cfg = load_config(CONFIG_DIR / "demo.yaml", [*gate, "latency.pace=false"])
    report = measure_latency(cfg, export_dir, out)
    for trial in report.trials:
        p99 = "-" if trial.p99_ms is None else f"{trial.p99_ms:.1f} ms"
        verdict = "CHOSEN" if trial.chosen else trial.failure
        print(f"  auto on local-cpu: {trial.variant:<5} p99 {p99:>10}  {verdict}")
    print(f"  -> {report.choice}", flush=True)
    chosen = next((t.variant for t in report.trials if t.chosen), "none")
    return {"auto_local_cpu": chosen, "auto_p99_ms": f"{report.p99_ms:.1f}"}


def deploy_at_size(export_dir: Path, root: Path, label: str) -> dict[str, str]:
    """The signed release's size and each deploy step's seconds on a local agent (a systems
    test: the policy has random weights), the agent gating a few unpaced steps on local-cpu."""
    sys.path.insert(0, str(ROOT))  # run as a script: the repository root is not on the path
    from benchmarks.local_agents import start_agent, wait_healthy
    from deploy_edge.keys import generate_keypair, load_private_key
    from deploy_edge.release.signature import write_release
    from robo_pipe.integrity import file_sha256

    private, public = generate_keypair(root / f"{label}-keys", "bench")
    release = root / f"{label}.release"
    start = time.perf_counter()
    write_release(
        export_dir,
        release,
        load_private_key(private),
        model_name=f"vla-{label}-policy",
        model_version="1",
        run_id="benchmark",
        release=1,
    )
    sign_s = time.perf_counter() - start
    size_mb = release.stat().st_size / 2**20
    # The deploy's steps are measured here, not whether the model fits 100 ms (it does not): a
    # profile whose control period (4 s) and budget it meets, so that the health check's
    # no-deadline-miss rule passes and the deploy runs to its end.
    lax = root / "lax-auto.yaml"
    lax.write_text(
        "name: bench-lax-auto\nengine: onnxruntime\nprecision: auto\nthreads: 1\n"
        "control_hz: 0.25\nbudget_ms: 4000.0\nallowed_misses: 0\nexecute: 1\n"
    )
    agent, entry = start_agent(root / "agents", f"bench-{label}", public, 5, 1, False, 3, lax)
    try:
        client = wait_healthy(entry)
        sha256 = file_sha256(release)
        start = time.perf_counter()
        client.upload(release, sha256)
        upload_s = time.perf_counter() - start
        record = client.deploy(sha256, systems_test=True)
    finally:
        agent.terminate()
        agent.wait(timeout=60)
    assert record.state == "active", record
    steps = {s.name: s.seconds for s in record.steps}
    print(
        f"release at {label}: {size_mb:.0f} MiB, signed in {sign_s:.1f} s, upload {upload_s:.1f} s"
    )
    print("  " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in steps.items()))
    return {
        "release_mb": f"{size_mb:.0f}",
        "sign_s": f"{sign_s:.1f}",
        "upload_s": f"{upload_s:.1f}",
        **{f"deploy_{name}_s": f"{seconds:.1f}" for name, seconds in steps.items()},
    }


def int8_success(checkpoint: Path, dataset: Path, root: Path, quick: bool) -> dict[str, str]:
    """The trained default VLA's held-out success, its INT8 variant against FP32 on the same
    seeds, with the paired test the no-regression gate uses."""
    from pipelines.steps.evaluate import evaluate_policy
    from pipelines.steps.export import export_checkpoint

    overrides = ["evaluate.episodes=10", "evaluate.workers=0"] if quick else []
    cfg = load_config(CONFIG_DIR / "demo.yaml", overrides)
    export_dir = root / "trained-export"
    exported = export_checkpoint(cfg, checkpoint, export_dir, dataset)
    int8 = read_io_spec(exported.path).variant("int8")
    assert int8 is not None, "the demo config exports an int8 variant"
    report = evaluate_policy(
        cfg, export_dir / int8.onnx_file, root / "eval-int8", baseline=export_dir
    )
    c = report.comparison
    assert c is not None
    print(
        f"default VLA held-out success: INT8 {report.success_rate:.1%} against FP32 "
        f"{c.baseline_success_rate:.1%} on the same {c.table.seeds} episodes: paired p "
        f"{c.p_value:.3g} ({'not worse' if c.passed else 'WORSE'})",
        flush=True,
    )
    return {
        "default_int8_success": f"{report.success_rate:.3f}",
        "default_fp32_success": f"{c.baseline_success_rate:.3f}",
        "default_int8_paired_p": f"{c.p_value:.3g}",
        "default_int8_not_worse": str(c.passed).lower(),
    }


if __name__ == "__main__":
    main()
