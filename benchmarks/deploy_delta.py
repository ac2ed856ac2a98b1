"""Delta deploys at size: a second LoRA fine-tune sent to a device that holds the first.

Two fine-tunes of one base, as the pipeline trains them (LoRA on the backbone's projections
plus the heads, ``finetune.trainable: lora``; two BC steps each, seeds 0 and 1: which tensors a
fine-tune changes is what matters here, not how far), exported through ``robo-pipe export``
with ``export.lora: separate`` and signed as releases 1 and 2. A real agent process deploys
release 1 (a systems test: random weights). Then, through a link throttled to ``--mb-s``
(default 20 MB/s, a robot's Wi-Fi; :mod:`benchmarks.link`), release 2 is uploaded:

1. whole (the client's ``delta=False``), timed, then deleted from the device;
2. as a delta with the link dropped once, part way through: the client fails, and the retry
   sends only the pieces still missing (the bytes of both tries are counted);
3. as a delta again from a clean start (the pieces the first delta left were consumed by its
   assembly, the upload deleted), timed, then deployed.

``sent_share`` is the delta's bytes over the release's, ``upload_speedup`` the whole upload's
seconds over the delta's (the device's assembly and whole-file hash included), and
``deploy_speedup`` the same with the device's steps (verify .. commit) added to both. A piece
with a flipped byte is refused (``tampered_refused``). ``lora_cost``: the FP32 graph's p50
latency with the adapters separate over the same checkpoint's graph with them merged (the
price of ``separate``), at 1 thread.

``--quick``: the ``tiny`` hub-vlm preset (seconds); full: the ``smolvlm-256m`` preset (two
exports of ~6 min and ~9.5 GiB each; ``--work-dir DIR`` keeps them for a rerun).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks.link import slow_link
from benchmarks.local_agents import TOKEN, start_agent, wait_healthy
from benchmarks.vla_scale import export_in_subprocess, small_dataset
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.bundle.layout import REFERENCE_FILE
from deploy_edge.client import AgentClient
from deploy_edge.device import DeviceEntry, DeviceError
from deploy_edge.engines import OnnxRuntimeEngine
from deploy_edge.keys import generate_keypair, load_private_key
from deploy_edge.release.pieces import batch_body, release_pieces
from deploy_edge.release.signature import write_release
from pipelines.config import CONFIG_DIR, load_config
from robo_pipe.integrity import file_sha256

PRESETS = {
    True: ("demo.yaml", ["policy.type=hub-vlm", "policy.preset=tiny", "policy.weights=random"]),
    False: ("vla-256m.yaml", []),
}
"""``--quick`` -> (shipped config, overrides)."""
TRAIN = ["finetune.bc.steps=2", "finetune.bc.workers=0", "finetune.bc.checkpoint_every=2"]


def delta_figure(quick: bool, mb_s: float = 20.0, work_dir: Path | None = None) -> dict[str, str]:
    """The figures of the module docstring; prints each as it is measured. ``work_dir``: keep
    the dataset, fine-tunes and exports there, and reuse them on a rerun (the stages reuse what
    they made; the agent starts fresh each time); default a temporary folder."""
    if work_dir is not None:
        shutil.rmtree(work_dir / "agents", ignore_errors=True)
        return _measure(work_dir, quick, mb_s)
    with tempfile.TemporaryDirectory(prefix="robo-pipe-delta-") as folder:
        return _measure(Path(folder), quick, mb_s)


def _measure(root: Path, quick: bool, mb_s: float) -> dict[str, str]:
    from stages.finetune.run import finetune

    config, overrides = PRESETS[quick]
    cfg = load_config(CONFIG_DIR / config, [*overrides, *TRAIN])
    dataset = small_dataset(root / "data")
    start = time.perf_counter()
    checkpoints = [
        Path(finetune(dataset, cfg.policy, cfg.finetune, None, seed, root / "ckpt").path)
        for seed in (0, 1)
    ]
    print(f"two LoRA fine-tunes: {time.perf_counter() - start:.0f} s", flush=True)
    separate = [*overrides, "export.lora=separate"]
    for number, checkpoint in enumerate(checkpoints, 1):
        export_in_subprocess(checkpoint, root / f"export-{number}", dataset, config, separate)
    shutil.rmtree(root / "keys", ignore_errors=True)  # a rerun in the same folder signs anew
    private, public = generate_keypair(root / "keys", "bench")
    releases = []
    for number in (1, 2):
        release = root / f"{number}.release"
        write_release(
            root / f"export-{number}",
            release,
            load_private_key(private),
            model_name="delta-policy",
            model_version=str(number),
            run_id="benchmark",
            release=number,
        )
        releases.append(release)
    size = releases[1].stat().st_size
    print(f"release 2: {size / 1e6:.1f} MB, {len(release_pieces(releases[1]))} pieces", flush=True)
    lax = root / "lax.yaml"  # the deploy's steps, not the 100 ms budget, are measured here
    lax.write_text(
        "name: bench-lax\nengine: onnxruntime\nprecision: fp32\nthreads: 1\n"
        "control_hz: 0.25\nbudget_ms: 4000.0\nallowed_misses: 0\nexecute: 1\n"
    )
    agent, entry = start_agent(root / "agents", "delta", public, 5, 1, False, 3, lax)
    try:
        figures = _over_the_link(entry, releases, size, mb_s)
    finally:
        agent.terminate()
        agent.wait(timeout=60)
    figures |= _lora_cost(checkpoints[1], root, dataset, config, overrides)
    return figures


def _over_the_link(
    entry: DeviceEntry, releases: list[Path], size: int, mb_s: float
) -> dict[str, str]:
    direct = wait_healthy(entry)
    first = direct.upload(releases[0], file_sha256(releases[0]), delta=False)
    assert direct.deploy(file_sha256(releases[0]), systems_test=True).state == "active"
    print(f"release 1 deployed ({first.summary})", flush=True)
    sha256 = file_sha256(releases[1])
    port = int(entry.url.rsplit(":", 1)[1])
    with slow_link(port, mb_s * 1e6) as (url, link):
        client = AgentClient(DeviceEntry(name=entry.name, url=url, token_env=entry.token_env))
        whole = client.upload(releases[1], sha256, delta=False)
        print(f"whole upload at {mb_s:g} MB/s: {whole.seconds:.1f} s ({whole.summary})")
        direct.delete_upload(sha256)
        # a delta cut part way: the retry sends only what is still missing
        missing = _missing_bytes(direct, releases[1])
        link.drop_once_after(missing // 2)
        try:
            client.upload(releases[1], sha256)
            raise AssertionError("the link did not drop")
        except DeviceError:
            pass
        resumed = client.upload(releases[1], sha256)
        print(
            f"delta cut at {missing // 2 / 1e6:.1f} MB: the retry sent {resumed.summary}",
            flush=True,
        )
        direct.delete_upload(sha256)
        delta = client.upload(releases[1], sha256)
        print(f"delta upload: {delta.seconds:.1f} s ({delta.summary})", flush=True)
        done = direct.deploy(sha256, systems_test=True)
    assert done.state == "active", done.reason
    steps_s = sum(s.seconds for s in done.steps)
    tampered = _tampered_piece_refused(direct, releases[1])
    return {
        "release_mb": f"{size / 1e6:.1f}",
        "sent_mb": f"{delta.sent / 1e6:.1f}",
        "sent_share": f"{delta.sent / size:.3f}",
        "whole_upload_s": f"{whole.seconds:.1f}",
        "upload_s": f"{delta.seconds:.1f}",
        "upload_speedup": f"{whole.seconds / delta.seconds:.2f}",
        "deploy_steps_s": f"{steps_s:.1f}",
        "deploy_speedup": f"{(whole.seconds + steps_s) / (delta.seconds + steps_s):.2f}",
        # the pieces verified before the cut were kept: the retry sent less than the delta
        "drop_resumed": str(link.drops == 1 and resumed.sent < missing).lower(),
        "resumed_mb": f"{resumed.sent / 1e6:.1f}",
        "tampered_refused": str(tampered).lower(),
    }


def _missing_bytes(client: AgentClient, release: Path) -> int:
    """Bytes of the pieces of ``release`` the device lacks."""
    pieces = release_pieces(release)
    answer = client.http.post("/pieces/missing", json={"pieces": [p.sha256 for p in pieces]})
    lacking = set(answer.json()["missing"])
    return sum({p.sha256: p.size for p in pieces if p.sha256 in lacking}.values())


def _tampered_piece_refused(client: AgentClient, release: Path) -> bool:
    piece = release_pieces(release)[-1]
    with release.open("rb") as f:
        f.seek(piece.offset)
        data = bytearray(f.read(piece.size))
    data[0] ^= 1
    answer = httpx.put(
        f"{client.entry.url}/pieces",
        content=batch_body([(piece.sha256, bytes(data))]),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    refused = answer.status_code == 422 and answer.json()["detail"]["reason"] == "hash-mismatch"
    print(f"a tampered piece: {answer.status_code} {answer.json()['detail']['reason']}")
    return refused


def _lora_cost(
    checkpoint: Path, root: Path, dataset: Path, config: str, overrides: list[str]
) -> dict[str, str]:
    """p50 of the separate-adapter graph over the merged one (FP32, 1 thread)."""
    merged = root / "export-merged"
    export_in_subprocess(checkpoint, merged, dataset, config, [*overrides, "export.variants=[]"])
    spec = read_io_spec(merged)
    with np.load(merged / REFERENCE_FILE, allow_pickle=False) as data:
        feeds = {n: data[n][:1] for n in spec.input_names}
    folders = {"separate": root / "export-2", "merged": merged}
    engines = {k: OnnxRuntimeEngine(f / spec.onnx_file, threads=1) for k, f in folders.items()}
    times: dict[str, list[float]] = {k: [] for k in engines}
    for engine in engines.values():
        for _ in range(2):  # warm-up
            engine.run(feeds)
    for _ in range(10):  # interleaved: load on the machine hits both alike
        for label, engine in engines.items():
            start = time.perf_counter()
            engine.run(feeds)
            times[label].append(time.perf_counter() - start)
    p50 = {k: float(np.median(t)) * 1e3 for k, t in times.items()}
    print(f"FP32 p50: separate {p50['separate']:.1f} ms, merged {p50['merged']:.1f} ms")
    return {
        "separate_p50_ms": f"{p50['separate']:.1f}",
        "merged_p50_ms": f"{p50['merged']:.1f}",
        "lora_cost": f"{p50['separate'] / p50['merged']:.3f}",
    }
