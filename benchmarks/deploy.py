"""Deploying the default VLA to a local edge agent: release size, and the wall time of each step
(upload, then the agent's verify, extract, engine, parity, gate, activate, health, commit),
with the agent's memory idle and after the deployment; then the agent's disk use after 100
refused uploads (over its cap, or bytes that do not hash to their sha256); and the cost of
the extract step's checks: the same release padded to 256 MiB (``--quick``: 32 MiB; a file
in its tokenizer folder) extracted by :func:`~deploy_edge.release.payload.extract_release` (member
sizes against the signed manifest, copies bounded by them, the cap, hashes, paths, external
data) and, in the same run, by the standard library's safe extraction plus a sha256 of every
file (the least any installer does): ``extract_checks_ratio`` is the first over the second.

A freshly initialised default VLA (the demo's size: the same graph and cost as a trained one)
is exported, signed into a release and deployed with the same client ``robo-pipe deploy``
uses to a real agent process (``python -m deploy_edge.agent``) on 127.0.0.1 with the
``local-cpu`` profile and the simulated rp5. The gate runs paced at the control rate, as on
the robot (``--quick``: 50 unpaced steps).

The fleet figure: the same policy registered in a temporary MLflow registry and rolled out
with the ``deploy_fleet`` flow (a canary, then one wave of the rest) to 3 and to 8 local
agents, the devices of the wave one at a time (``max_parallel=1``) and all at once; wall time
of each rollout, after an untimed first rollout that warms every agent (and starts Prefect's
temporary server). The fleet's agents gate 50 unpaced steps (``--quick``: 20) and check 10
health ticks, so that the figure is about the rollout, not the control rate, against a budget
none misses (the eight "devices" share this machine's cores).

The fleet command figure: ``robo-pipe deploy --fleet`` run as a user runs it (a fresh process
of the tree this file is in, so that a worktree of an older commit measures that commit) to 3
and 8 local agents, a canary then one wave; its overhead is the command's wall time minus the
devices' own time (per wave its slowest device, summed), with the temporary Prefect server
each command starts and with ``robo-pipe ui``'s servers running; and the seconds it takes to
refuse a fleet file with a bad field, an unset token variable and an unreachable registry.

Run: ``python benchmarks/deploy.py [--quick] [--fleet-only | --fleet-command-only |
--delta-only]`` (the delta figure: :mod:`benchmarks.deploy_delta`); the last
line is ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root is not on the path

from benchmarks.deploy_delta import delta_figure  # noqa: E402
from benchmarks.local_agents import TOKEN, rss_mb, start_agent, wait_healthy  # noqa: E402
from configs import targets_dir  # noqa: E402
from deploy_edge.bundle.io_spec import read_io_spec  # noqa: E402
from deploy_edge.client import AgentClient  # noqa: E402
from deploy_edge.keys import generate_keypair, load_private_key, load_public_key  # noqa: E402
from deploy_edge.release.payload import extract_release  # noqa: E402
from deploy_edge.release.signature import verify_release, write_release  # noqa: E402
from pipelines.config import CONFIG_DIR, PipelineConfig, load_config  # noqa: E402
from pipelines.services.local_servers import free_port  # noqa: E402
from robo_pipe.integrity import file_sha256  # noqa: E402
from robots.rp5 import RP5  # noqa: E402
from stages.export import export  # noqa: E402
from stages.policy.checkpoint import save_new_policy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 unpaced gate steps")
    parser.add_argument("--fleet-only", action="store_true", help="only the fleet figures")
    parser.add_argument(
        "--fleet-command-only", action="store_true", help="only the fleet command's overhead"
    )
    parser.add_argument(
        "--delta-only", action="store_true", help="only the delta deploy (benchmarks/deploy_delta)"
    )
    parser.add_argument(
        "--work-dir", type=Path, help="the delta figure's exports, kept here for a rerun"
    )
    args = parser.parse_args()
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    only = args.fleet_only or args.fleet_command_only or args.delta_only
    figures = {} if only else single_agent(cfg, args.quick)
    if not (args.fleet_command_only or args.delta_only):
        figures.update(fleet_figure(cfg, args.quick))
    if not args.delta_only:
        figures.update(fleet_command_figure(cfg, args.quick))
    if not (args.fleet_only or args.fleet_command_only):
        delta = delta_figure(args.quick, work_dir=args.work_dir)
        figures.update({f"delta_{k}": v for k, v in delta.items()})
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


def fleet_figure(cfg: PipelineConfig, quick: bool) -> dict[str, str]:
    """Wall time of a rollout to 3 and 8 agents: a wave's devices one at a time vs at once."""
    sizes, modes = (3, 8), {"seq": 1, "conc": None}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["ROBO_PIPE_HOME"] = str(root / "home")
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
        from pipelines import tracking
        from pipelines.registry.exports import register_export
        from pipelines.registry.tags import ONNX_HASH_TAG
        from pipelines.registry.versions import get_version
        from pipelines.services.settings import configure

        configure()
        from pipelines.deploy.fleet import roll_out

        checkpoint = save_new_policy(
            cfg.policy, cfg.scene.cameras, cfg.scene.image_size, root / "ckpt"
        )
        bundle = Path(export(checkpoint, root / "export", RP5.control_hz).path)
        private, public = generate_keypair(root / "keys", "bench")
        rollouts = 1 + len(sizes) * len(modes)  # the warm-up, then each measured one
        run = tracking.TrackedRun.start("fleet-benchmark", "register")
        for _ in range(rollouts):  # each rollout a newer version of the same bundle
            register_export(bundle, "bench-policy", run, {ONNX_HASH_TAG: "x"})
        run.finish()
        names = [f"bench-{i}" for i in range(max(sizes))]
        # Eight "devices" share this machine's cores: a gate measured while the others run is
        # not a device's latency, so the fleet's agents gate against a budget none misses.
        lax = yaml.safe_load((targets_dir() / "local-cpu.yaml").read_text())
        lax.update(name="bench-lax", budget_ms=10_000.0, allowed_misses=1_000)
        (root / "lax.yaml").write_text(yaml.safe_dump(lax))
        steps = 20 if quick else 50
        started = [
            start_agent(root / "agents", n, public, steps, 2, False, 10, root / "lax.yaml")
            for n in names
        ]
        try:
            for _, entry in started:
                wait_healthy(entry).close()

            def roll(version: int, count: int, parallel: int | None) -> float:
                fleet = root / f"fleet-{count}.yaml"
                devices = [e.model_dump(mode="json", exclude_none=True) for _, e in started]
                rollout = {"canary": 1, "waves": [count - 1], "device_timeout_s": 1800}
                fleet.write_text(yaml.safe_dump({"devices": devices[:count], "rollout": rollout}))
                start = time.perf_counter()
                result = roll_out(
                    version=get_version("bench-policy", str(version)),
                    fleet=str(fleet),
                    key=str(private),
                    max_parallel=parallel,
                )
                seconds = time.perf_counter() - start
                assert result.complete, result.to_json()
                return seconds

            roll(1, len(names), None)  # warm-up: every agent runs v1
            timed: dict[str, float] = {}
            version = 2
            for count in sizes:
                for mode, parallel in modes.items():
                    timed[f"fleet{count}_{mode}_s"] = roll(version, count, parallel)
                    version += 1
        finally:
            for agent, _ in started:
                agent.terminate()
            for agent, _ in started:
                agent.wait(timeout=30)
    for count in sizes:
        seq, conc = timed[f"fleet{count}_seq_s"], timed[f"fleet{count}_conc_s"]
        print(
            f"fleet of {count}: canary + 1 wave, one device at a time {seq:.1f} s, the wave at "
            f"once {conc:.1f} s ({seq / conc:.2f}x)"
        )
    return {k: f"{v:.1f}" for k, v in timed.items()}


def robo_pipe(*args: str, **env: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall seconds of ``robo-pipe ARGS`` as a user runs it (a fresh process: imports, checks,
    servers), with the code of the tree this benchmark is in, and what it returned."""
    tree = Path(__file__).resolve().parents[1]
    paths = [str(tree), os.environ.get("PYTHONPATH", "")]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **env},
    )
    return time.perf_counter() - start, done


def device_seconds(result: dict[str, Any]) -> float:
    """The devices' own time in a rollout: per wave, its slowest device (a wave's devices
    deploy at once), summed over the waves."""
    slowest: dict[int, float] = {}
    for row in result["devices"]:
        slowest[row["wave"]] = max(slowest.get(row["wave"], 0.0), row["seconds"] or 0.0)
    return sum(slowest.values())


def fleet_command_figure(cfg: PipelineConfig, quick: bool) -> dict[str, str]:
    """The fleet command's overhead: wall time of ``robo-pipe deploy --fleet`` (a canary, then
    one wave) to 3 and 8 agents minus the devices' own time (:func:`device_seconds`), with the
    temporary Prefect server each command starts and with the servers of ``robo-pipe ui``
    running (started once: what a long-running server saves); and the seconds to reject a bad
    fleet file, a fleet whose token variable is unset, and an unreachable registry."""
    from pipelines.services.local_servers import LocalServers

    sizes = (3, 8)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["ROBO_PIPE_HOME"] = str(root / "home")
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
        os.environ.pop("PREFECT_API_URL", None)
        from pipelines import tracking
        from pipelines.registry.exports import register_export
        from pipelines.registry.tags import ONNX_HASH_TAG
        from pipelines.services.settings import configure

        configure()
        checkpoint = save_new_policy(
            cfg.policy, cfg.scene.cameras, cfg.scene.image_size, root / "ckpt"
        )
        bundle = Path(export(checkpoint, root / "export", RP5.control_hz).path)
        private, public = generate_keypair(root / "keys", "bench")
        run = tracking.TrackedRun.start("fleet-command-benchmark", "register")
        for _ in range(1 + 2 * len(sizes)):  # the warm-up, then each measured rollout
            register_export(bundle, "bench-policy", run, {ONNX_HASH_TAG: "x"})
        run.finish()
        figures = rejections(root)
        lax = yaml.safe_load((targets_dir() / "local-cpu.yaml").read_text())
        lax.update(name="bench-lax", budget_ms=10_000.0, allowed_misses=1_000)
        (root / "lax.yaml").write_text(yaml.safe_dump(lax))
        steps = 20 if quick else 50
        started = [
            start_agent(root / "agents", f"cmd-{i}", public, steps, 2, False, 10, root / "lax.yaml")
            for i in range(max(sizes))
        ]
        servers: LocalServers | None = None
        try:
            for _, entry in started:
                wait_healthy(entry).close()
            entries = [e.model_dump(mode="json", exclude_none=True) for _, e in started]

            def roll(version: int, count: int) -> tuple[float, float]:
                fleet = root / f"fleet-{count}.yaml"
                rollout = {"canary": 1, "waves": [count - 1], "device_timeout_s": 1800}
                fleet.write_text(yaml.safe_dump({"devices": entries[:count], "rollout": rollout}))
                uri = f"models:/bench-policy/{version}"
                wall, done = robo_pipe(
                    "deploy", uri, "--fleet", str(fleet), "--key", str(private), "--json"
                )
                assert done.returncode == 0, done.stderr[-3000:]
                return wall, device_seconds(json.loads(done.stdout.strip().splitlines()[-1]))

            roll(1, max(sizes))  # warm-up: every agent runs v1, the Prefect database exists
            version = 2
            for servers_kind in ("embedded", "ui"):
                if servers_kind == "ui":
                    servers = LocalServers(owner="benchmark")
                    servers.start()
                for count in sizes:
                    wall, devices = roll(version, count)
                    version += 1
                    print(
                        f"robo-pipe deploy --fleet, {count} agents, {servers_kind} Prefect "
                        f"server: {wall:.1f} s wall, devices {devices:.1f} s, overhead "
                        f"{wall - devices:.1f} s"
                    )
                    figures[f"fleet{count}_{servers_kind}_wall_s"] = f"{wall:.1f}"
                    figures[f"fleet{count}_{servers_kind}_overhead_s"] = f"{wall - devices:.1f}"
        finally:
            if servers is not None:
                servers.stop()
            for agent, _ in started:
                agent.terminate()
            for agent, _ in started:
                agent.wait(timeout=30)
    return figures


def rejections(root: Path) -> dict[str, str]:
    """Seconds for ``robo-pipe deploy --fleet`` to refuse a fleet file with a bad field, a
    fleet whose token variable is unset, and a registry nobody listens for (exit 2 or 3)."""
    bad = root / "bad-fleet.yaml"
    bad.write_text(yaml.safe_dump({"devices": [{"name": "a"}]}))
    fleet = root / "unset-token.yaml"
    device = {"name": "a", "url": "http://127.0.0.1:9", "token_env": "BENCH_UNSET_TOKEN"}
    fleet.write_text(yaml.safe_dump({"devices": [device]}))
    os.environ.pop("BENCH_UNSET_TOKEN", None)
    uri, figures = "models:/bench-policy/1", {}
    cases = {
        "reject_bad_fleet_s": (bad, {}),
        "reject_unset_token_s": (fleet, {}),
        "reject_no_registry_s": (
            fleet,
            {"BENCH_UNSET_TOKEN": TOKEN, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"},
        ),
    }
    for name, (path, env) in cases.items():
        wall, done = robo_pipe("deploy", uri, "--fleet", str(path), **env)
        assert done.returncode in (2, 3), (name, done.returncode, done.stderr[-2000:])
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        print(f"{name}: {wall:.2f} s (exit {done.returncode}: {last[:120]})")
        figures[name] = f"{wall:.2f}"
    return figures


def single_agent(cfg: PipelineConfig, quick: bool) -> dict[str, str]:
    """Release size, signing, upload and each agent step on one agent; its memory."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = save_new_policy(
            cfg.policy, cfg.scene.cameras, cfg.scene.image_size, root / "ckpt"
        )
        bundle = Path(export(checkpoint, root / "export", RP5.control_hz).path)
        private, public = generate_keypair(root / "keys", "bench")
        start = time.perf_counter()
        release = root / "policy.release"
        sign(bundle, release, private)
        sign_s = time.perf_counter() - start
        size_mb = release.stat().st_size / 1e6
        extraction = extraction_cost(bundle, root, private, public, 32 if quick else 256)
        agent, entry = start_agent(
            root,
            "bench",
            public,
            50 if quick else cfg.latency.steps,
            5 if quick else cfg.latency.warmup,
            not quick,
            30,
        )
        try:
            client = wait_healthy(entry)
            idle_mb = rss_mb(agent.pid)
            sha256 = file_sha256(release)
            start = time.perf_counter()
            client.upload(release, sha256)
            upload_s = time.perf_counter() - start
            start = time.perf_counter()
            record = client.deploy(sha256)
            deploy_s = time.perf_counter() - start
            after_mb = rss_mb(agent.pid)
            refused = refused_uploads(client, root / "bench" / "state" / "uploads", sha256)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
    assert record.state == "active", record
    steps = {s.name: s.seconds for s in record.steps}
    print(f"release: {size_mb:.1f} MB, signed in {sign_s:.2f} s; upload {upload_s:.2f} s")
    for name, seconds in steps.items():
        print(f"  {name:<9} {seconds:7.2f} s")
    gate = record.gate
    assert gate is not None, record
    print(
        f"on-device gate: p50 {gate.p50_ms:.2f} ms, p99 {gate.p99_ms:.2f} ms; agent memory "
        f"{idle_mb:.0f} MB idle, {after_mb:.0f} MB serving"
    )
    return {
        "release_mb": f"{size_mb:.2f}",
        "sign_s": f"{sign_s:.2f}",
        "upload_s": f"{upload_s:.2f}",
        **{f"{name}_s": f"{seconds:.2f}" for name, seconds in steps.items()},
        "deploy_s": f"{upload_s + deploy_s:.2f}",
        "p99_ms": f"{gate.p99_ms:.2f}",
        "agent_idle_mb": f"{idle_mb:.0f}",
        "agent_serving_mb": f"{after_mb:.0f}",
        **refused,
        **extraction,
    }


def sign(bundle: Path, out: Path, private: Path) -> None:
    """Sign ``bundle`` into the release ``out`` as release 1 of ``demo-policy`` v1."""
    write_release(
        bundle,
        out,
        load_private_key(private),
        model_name="demo-policy",
        model_version="1",
        run_id="benchmark",
        release=1,
    )


def extraction_cost(
    bundle: Path, root: Path, private: Path, public: Path, pad_mib: int, repeats: int = 3
) -> dict[str, str]:
    """Median seconds to extract a release of the bundle padded by ``pad_mib`` MiB, with
    robo-pipe's checks and with the standard library's safe extraction plus hashing."""
    padded = root / "padded"
    shutil.copytree(bundle, padded)
    spec = read_io_spec(padded)
    with (padded / spec.tokenizer / "padding.bin").open("wb") as f:
        for _ in range(pad_mib):
            f.write(os.urandom(1 << 20))
    release = root / "padded.release"
    sign(padded, release, private)
    manifest = verify_release(release, [load_public_key(public)])
    checked, plain = [], []
    for i in range(repeats):
        start = time.perf_counter()
        extract_release(release, manifest, root / f"checked-{i}", max_bytes=4096 << 20)
        checked.append(time.perf_counter() - start)
        start = time.perf_counter()
        with tarfile.open(release, "r:") as tar:
            tar.extractall(root / f"plain-{i}", filter="data")
        for path in (root / f"plain-{i}").rglob("*"):
            if path.is_file():
                file_sha256(path)
        plain.append(time.perf_counter() - start)
        shutil.rmtree(root / f"checked-{i}")
        shutil.rmtree(root / f"plain-{i}")
    mb = release.stat().st_size / 1e6
    with_checks, baseline = statistics.median(checked), statistics.median(plain)
    print(
        f"extract a {mb:.0f} MB release: {with_checks:.2f} s with robo-pipe's checks, "
        f"{baseline:.2f} s by tarfile's data filter + sha256 (x{with_checks / baseline:.2f})"
    )
    return {
        "extract_release_mb": f"{mb:.0f}",
        "extract_checked_s": f"{with_checks:.2f}",
        "extract_plain_s": f"{baseline:.2f}",
        "extract_checks_ratio": f"{with_checks / baseline:.2f}",
    }


def refused_uploads(client: AgentClient, uploads: Path, keep: str) -> dict[str, str]:
    """The agent's disk use after 100 refused uploads of 1 MiB each: 50 declaring more than its
    ``max_release_mb`` (refused before a byte is written) and 50 whose bytes do not hash to
    the sha256 they are sent under (deleted once complete); the genuine release ``keep``
    aside."""
    chunk = os.urandom(1 << 20)
    start = time.perf_counter()
    for i in range(100):
        declared = 4097 << 20 if i < 50 else len(chunk)  # over the default 4096 MiB cap
        answer = client.http.put(f"/uploads/{i:064x}?offset=0&size={declared}", content=chunk)
        assert answer.status_code in (413, 422), answer.text
    seconds = time.perf_counter() - start
    left = sum(p.stat().st_size for p in uploads.iterdir() if not p.name.startswith(keep))
    print(f"100 refused uploads of 1 MiB: {seconds:.2f} s; {left} bytes left in uploads/")
    return {"refused_uploads_s": f"{seconds:.2f}", "refused_uploads_left_bytes": str(left)}


if __name__ == "__main__":
    main()
