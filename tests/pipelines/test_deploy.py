"""``robo-pipe deploy`` through the CLI against real edge agents on 127.0.0.1 (each in its own
state directory): a registry version becomes the device's active policy and runs an episode;
an untrusted key, a wrong token and a cut upload are handled as a release engineer needs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.services.local_servers import free_port
from tests.pipelines.test_cli import ROOT
from tests.pipelines.test_flow import robo_pipe

MODEL = "edge-policy"
TOKEN = "s3cret-token-for-tests"
DEPLOY_TOKEN = "deploy-scope-token-for-tests"
"""Deploys but may not force (the agents' TOKEN is an operate token)."""


@pytest.fixture(scope="module")
def registered(shared_home: Path, export_dir: Path) -> str:
    """A tiny exported policy registered as ``edge-policy`` v1 (and v2, the same export)."""
    from pipelines import tracking
    from pipelines.registry.exports import register_export
    from pipelines.registry.tags import ONNX_HASH_TAG
    from pipelines.services.settings import configure

    os.environ["ROBO_PIPE_HOME"] = str(shared_home)
    configure()
    bundle = export_dir
    for _ in range(2):  # v2: a newer release of the same bundle
        run = tracking.TrackedRun.start("edge-tests", "register")
        register_export(bundle, MODEL, run, {ONNX_HASH_TAG: "x"})
        run.finish()
    return MODEL


@pytest.fixture
def home_path(shared_home: Path) -> Path:
    return shared_home


@pytest.fixture(scope="module")
def signing(shared_home: Path) -> dict[str, Path]:
    """A trusted key pair (``robo-pipe keys generate``) and an untrusted one."""
    keys = {}
    for name in ("release", "stranger"):
        made = robo_pipe("keys", "generate", "--name", name, home=shared_home)
        assert made.returncode == 0, made.stderr
        keys[name] = shared_home / "keys" / f"{name}.key"
        assert keys[name].is_file() and (shared_home / "keys" / f"{name}.pub").is_file()
    again = robo_pipe("keys", "generate", "--name", "release", home=shared_home)
    assert again.returncode == 2 and "release.key" in again.stderr, "never overwrites a key"
    return keys


def start_agent(
    home: Path, state: Path, lock_file: Path | None = None, **extra: Any
) -> dict[str, Any]:
    """A real agent (``robo-pipe edge-agent``) with its own state directory, trusting the
    release key, and a devices file naming it ``dev-arm-01``."""
    port = free_port()
    device = {
        "name": "dev-arm-01",
        "listen": f"127.0.0.1:{port}",
        "trusted_keys": [str(home / "keys" / "release.pub")],
        "tokens": {
            "deploy": [hashlib.sha256(DEPLOY_TOKEN.encode()).hexdigest()],
            "operate": [hashlib.sha256(TOKEN.encode()).hexdigest()],
        },
        "target": "local-cpu",
        "state_dir": str(state / "agent-state"),
        "gate_steps": 30,
        "gate_warmup": 3,
        "pace": False,
        "health_ticks": 8,
        **({"lock_file": str(lock_file)} if lock_file else {}),
        **extra,
    }
    config = state / "device.yaml"
    config.write_text(yaml.safe_dump(device))
    devices = state / "devices.yaml"
    entry = {"name": "dev-arm-01", "url": f"http://127.0.0.1:{port}", "token_env": "ARM_TOKEN"}
    devices.write_text(yaml.safe_dump({"devices": [entry]}))
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "edge-agent", "--device-config", str(config)],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        time.sleep(0.2)
    return {"devices": devices, "port": port, "process": process}


@pytest.fixture
def agent(
    registered: str, signing: dict[str, Path], shared_home: Path, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """A fresh agent for each test (tests run in any order)."""
    started = start_agent(shared_home, tmp_path)
    yield started
    started["process"].terminate()
    started["process"].wait(timeout=20)


def deploy(
    agent: dict[str, Any], home: Path, *extra: str, token: str = TOKEN, version: int = 1
) -> Any:
    return robo_pipe(
        "deploy",
        f"models:/{MODEL}/{version}",
        "--device",
        "dev-arm-01",
        "--devices",
        str(agent["devices"]),
        *extra,
        home=home,
        ARM_TOKEN=token,
    )


def agent_json(agent: dict[str, Any], path: str) -> Any:
    """The agent's answer to ``GET path``."""
    import httpx

    answer = httpx.get(
        f"http://127.0.0.1:{agent['port']}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    answer.raise_for_status()
    return answer.json()


def status(agent: dict[str, Any]) -> dict[str, Any]:
    return dict(agent_json(agent, "/status"))


def test_deploy_makes_a_registry_version_the_devices_active_policy(
    registered: str, signing: dict[str, Path], agent: dict[str, Any], shared_home: Path
) -> None:
    import httpx

    done = deploy(agent, shared_home, "--key", str(signing["release"]), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["state"] == "active" and record["model_version"] == "1"
    assert record["origin"]["by"] == "cli", "the device's history says who asked"
    steps = [s["name"] for s in record["steps"]]
    for step in ("verify", "extract", "engine", "parity", "gate", "activate", "health", "commit"):
        assert step in steps and all(s["ok"] for s in record["steps"]), record["steps"]
    assert (
        "on-device latency (sync): p50" in done.stderr
        and "dev-arm-01 runs edge-policy v1" in done.stderr
    )
    # the table's upload row: a fresh device holds no piece of it, so all of it went
    assert re.search(r"upload .* MB sent \(\d+\.\d%\); the device held 0 of \d+", done.stderr)
    now = status(agent)
    assert now["active"]["model_version"] == "1" and now["active"]["release"] == 1
    episode = httpx.post(
        f"http://127.0.0.1:{agent['port']}/episode",
        json={"instruction": "touch the red cube", "max_ticks": 5},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    ).json()
    assert episode["version"] == f"{MODEL}:1" and episode["ticks"] == 5 and episode["errors"] == 0
    # The same version again (an idempotent CI job): asked what it runs, the device already
    # runs this content, so nothing is sent and it exits 0, in one line; the device's uploads
    # (a refused upload would stay there) and its history show no second deployment.
    assert agent_json(agent, "/uploads") == [], "the installed upload is gone from the device"
    history = agent_json(agent, "/history")
    again = deploy(agent, shared_home, "--key", str(signing["release"]))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "dev-arm-01 already runs edge-policy v1" in again.stdout, again.stdout
    assert "nothing uploaded" in again.stdout and "upload" not in again.stderr, again.stderr
    quiet = deploy(agent, shared_home, "--key", str(signing["release"]), "--json")
    record = json.loads(quiet.stdout.strip().splitlines()[-1])
    assert quiet.returncode == 0 and record["unchanged"] is True, quiet.stdout
    assert record["state"] == "active" and record["id"] == history[0]["id"], record
    assert agent_json(agent, "/uploads") == [], "no byte of the release was sent again"
    assert agent_json(agent, "/history") == history, "no deployment was asked for"


def test_a_device_runs_a_release_only_with_its_version_and_its_content() -> None:
    """The one check behind every "already runs it" (deploy --device, fleet rollouts, the
    demo's agent): model, version and bundle content; a re-signed release of the same bundle
    counts, the same version number from another home does not."""
    from types import SimpleNamespace
    from typing import cast

    from deploy_edge.release.manifest import Manifest, content_digest
    from deploy_edge.wire import Slot
    from pipelines.deploy.release import runs_release

    files = {"policy.onnx": "1" * 64, "io_spec.json": "2" * 64}
    assert content_digest(files) == content_digest(dict(reversed(files.items()))), "unordered"

    def manifest(version: str, bundle: dict[str, str]) -> Manifest:
        made = SimpleNamespace(model_name=MODEL, model_version=version, files=bundle)
        made.content_sha256 = content_digest(bundle)
        return cast(Manifest, made)

    def slot(content: str, release_sha: str = "a" * 64) -> Slot:
        return Slot(MODEL, "1", 1, "/slots/1", release_sha, content_sha256=content)

    same = manifest("1", files)
    assert runs_release(slot(same.content_sha256), same, "b" * 64), "re-signed: same content"
    other_home = manifest("1", {**files, "policy.onnx": "3" * 64})
    assert not runs_release(slot(same.content_sha256), other_home, "a" * 64)
    assert not runs_release(slot(same.content_sha256), manifest("2", files), "a" * 64)
    assert not runs_release(None, same, "a" * 64)
    # a slot recorded before content digests: only its very release file counts
    assert runs_release(slot(""), same, "a" * 64) and not runs_release(slot(""), same, "b" * 64)


def test_an_untrusted_key_is_refused_and_the_active_version_stays(
    registered: str, signing: dict[str, Path], agent: dict[str, Any], shared_home: Path
) -> None:
    assert deploy(agent, shared_home, "--key", str(signing["release"])).returncode == 0
    before = status(agent)["active"]
    assert before["model_version"] == "1"
    refused = deploy(agent, shared_home, "--key", str(signing["stranger"]), version=2)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "untrusted" in refused.stderr and "refused" in refused.stderr
    assert status(agent)["active"] == before


def test_a_wrong_token_or_an_unknown_device_is_a_named_input_error(
    registered: str, signing: dict[str, Path], agent: dict[str, Any], shared_home: Path
) -> None:
    wrong = deploy(agent, shared_home, "--key", str(signing["release"]), token="guess")
    assert wrong.returncode == 2 and "refused the token" in wrong.stderr
    assert "needs a token of scope" in wrong.stderr and "Traceback" not in wrong.stderr
    key = ("--key", str(signing["release"]))
    forced = deploy(agent, shared_home, "--force", *key, token=DEPLOY_TOKEN)
    assert forced.returncode == 2, forced.stdout + forced.stderr
    assert "with force needs a token of scope 'operate'" in " ".join(forced.stderr.split())
    assert status(agent)["active"] is None and "Traceback" not in forced.stderr
    unknown = robo_pipe(
        "deploy",
        f"models:/{MODEL}/1",
        "--device",
        "no-such-arm",
        "--devices",
        str(agent["devices"]),
        home=shared_home,
    )
    assert unknown.returncode == 2 and "no device 'no-such-arm'" in unknown.stderr


def test_a_cut_upload_resumes_from_the_bytes_the_agent_has(
    registered: str, signing: dict[str, Path], agent: dict[str, Any], shared_home: Path
) -> None:
    import httpx

    from deploy_edge.client import AgentClient
    from deploy_edge.device import DeviceEntry
    from pipelines.deploy.release import bundle_release
    from pipelines.registry.versions import get_version
    from pipelines.services.settings import configure

    configure()  # in-process MLflow reads this home's registry
    _, path = bundle_release(get_version(MODEL, "2"), signing["release"])
    data = path.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()
    url = f"http://127.0.0.1:{agent['port']}/uploads/{sha256}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    half, size = len(data) // 2, f"size={len(data)}"
    assert httpx.put(f"{url}?offset=0&{size}", content=data[:half], headers=auth).status_code == 200
    # the connection drops here; a retry at a wrong offset is told where to resume
    stale = httpx.put(f"{url}?offset=0&{size}", content=data[:half], headers=auth)
    assert stale.status_code == 409 and stale.json()["detail"]["received"] == half
    assert httpx.put(f"{url}?offset=0&{size}", content=b"x", headers={}).status_code == 401
    os.environ["ARM_TOKEN"] = TOKEN
    entry = DeviceEntry(
        name="dev-arm-01", url=f"http://127.0.0.1:{agent['port']}", token_env="ARM_TOKEN"
    )
    sent: list[int] = []
    AgentClient(entry).upload(path, sha256, lambda done, total: sent.append(done), delta=False)
    assert sent and sent[-1] == len(data) and min(sent) > half, "resumed, not restarted"
    record = AgentClient(entry).deploy(sha256)
    assert record.state == "active" and record.model_version == "2"


def test_device_uploads_lists_and_deletes_a_devices_uploads(
    agent: dict[str, Any], shared_home: Path
) -> None:
    """``robo-pipe devices uploads``: --delete SHA deletes one, --all the rest; the table (here
    its --json) shows what is left. The group's old name says what it is called now."""
    import httpx

    auth = {"Authorization": f"Bearer {TOKEN}"}
    partials = ["1" * 64, "2" * 64]
    for sha256 in partials:
        url = f"http://127.0.0.1:{agent['port']}/uploads/{sha256}?offset=0&size=100"
        assert httpx.put(url, content=b"x" * 10, headers=auth).status_code == 200
    devices = ("--devices", str(agent["devices"]))
    one = robo_pipe(
        "devices",
        "uploads",
        "dev-arm-01",
        *devices,
        "--delete",
        partials[0],
        "--json",
        home=shared_home,
        ARM_TOKEN=TOKEN,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    assert [(u["sha256"], u["received"], u["size"]) for u in json.loads(one.stdout)] == [
        (partials[1], 10, 100)
    ]
    rest = robo_pipe(
        "devices",
        "uploads",
        "dev-arm-01",
        *devices,
        "--all",
        "--json",
        home=shared_home,
        ARM_TOKEN=TOKEN,
    )
    assert rest.returncode == 0 and json.loads(rest.stdout) == [], rest.stderr[-2000:]
    assert f"deleted {partials[1]}" in rest.stderr
    old = robo_pipe("device", "uploads", "dev-arm-01", *devices, home=shared_home)
    assert old.returncode == 2 and "robo-pipe devices" in old.stderr, old.stderr[-2000:]


def test_devices_verbs_activate_unstage_and_roll_back_a_real_agent(
    registered: str,
    signing: dict[str, Path],
    shared_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``robo-pipe devices status|history|activate|rollback|unstage`` on a real agent: the
    device's refusals exit 1 with its reason, each action is in its history as asked by the
    CLI, a rollback leaves no rollback target (never the version rolled back from), and an
    unknown device, an unset token (2) or a device that does not answer (3) are one line."""
    from deploy_edge.device import DeviceEntry
    from pipelines.deploy.release import bundle_release, deploy_release
    from pipelines.registry.versions import get_version
    from pipelines.services.settings import configure

    configure()  # the registry of this module's home, in this process
    lock = tmp_path / "robot-busy"
    lock.touch()
    started = start_agent(shared_home, tmp_path, lock_file=lock)
    monkeypatch.setenv("ARM_TOKEN", TOKEN)
    entry = DeviceEntry(
        name="dev-arm-01", url=f"http://127.0.0.1:{started['port']}", token_env="ARM_TOKEN"
    )
    v1, v2 = (bundle_release(get_version(MODEL, str(n)), signing["release"])[1] for n in (1, 2))
    devices = ("--devices", str(started["devices"]))

    def verb(*args: str, json_out: bool = True) -> tuple[int, Any, str]:
        done = robo_pipe("devices", *args, *(("--json",) if json_out else ()), home=shared_home)
        answer = json.loads(done.stdout) if done.returncode == 0 and json_out else None
        return done.returncode, answer, done.stderr

    try:
        assert deploy_release(entry, v1)[0].state == "staged"  # the robot is busy
        code, _, err = verb("activate", "dev-arm-01", *devices)
        assert code == 1 and "robot-busy lock is set" in err, err[-2000:]
        code, unstaged, err = verb("unstage", "dev-arm-01", *devices)
        assert code == 0 and unstaged["state"] == "unstaged", err[-2000:]
        assert unstaged["origin"]["by"] == "cli" and unstaged["model_version"] == "1"
        assert status(started)["staged"] is None
        code, _, err = verb("unstage", "dev-arm-01", *devices)
        assert code == 1 and "nothing staged" in err, err[-2000:]

        lock.unlink()
        assert deploy_release(entry, v1)[0].state == "active"
        assert deploy_release(entry, v2)[0].state == "active"
        code, _, err = verb("rollback", "dev-arm-01", *devices, "--to", "7")
        assert code == 1 and "release 7 is not the previous version" in err, err[-2000:]
        assert "edge-policy:1 (release 1)" in err, "it names what the device holds"
        code, back, err = verb("rollback", "dev-arm-01", *devices, "--to", "1")
        assert code == 0 and back["state"] == "rolled_back" and back["release"] == 1, err
        code, now, err = verb("status", "dev-arm-01", *devices)
        assert code == 0 and now["active"]["release"] == 1, err[-2000:]
        assert now["previous"] is None, "never the version rolled back from"
        code, _, err = verb("rollback", "dev-arm-01", *devices)
        assert code == 1 and "no previous version" in err, err[-2000:]
        assert status(started)["active"]["release"] == 1, "release 2 is never re-activated"

        fleet = tmp_path / "fleet.yaml"  # the same device, named in a fleet file
        fleet.write_text(yaml.safe_dump(yaml.safe_load(started["devices"].read_text())))
        code, history, err = verb("history", "dev-arm-01", "--fleet", str(fleet))
        assert code == 0, err[-2000:]
        assert [(d["state"], d["release"]) for d in history[:2]] == [
            ("rolled_back", 1),
            ("active", 2),
        ]
        assert history[0]["origin"]["by"] == "cli" and "rollback from" in history[0]["reason"]
        assert "unstaged" in [d["state"] for d in history]

        code, _, err = verb("status", "no-such-arm", *devices)
        assert code == 2 and "no device 'no-such-arm'" in err, err[-2000:]
        ghost = tmp_path / "ghost.yaml"
        ghost.write_text(
            yaml.safe_dump(
                {
                    "devices": [
                        {"name": "unset", "url": entry.url, "token_env": "NO_SUCH_TOKEN_VAR"},
                        {
                            "name": "gone",
                            "url": f"http://127.0.0.1:{free_port()}",
                            "token_env": "ARM_TOKEN",
                        },
                    ]
                }
            )
        )
        code, _, err = verb("status", "unset", "--devices", str(ghost))
        assert code == 2 and "NO_SUCH_TOKEN_VAR is not set" in err, err[-2000:]
        code, _, err = verb("rollback", "gone", "--devices", str(ghost))
        assert code == 3 and len(err.strip().splitlines()) == 1, err[-2000:]
        assert "Traceback" not in err and "127.0.0.1" in err
    finally:
        started["process"].terminate()
        started["process"].wait(timeout=20)


def test_the_robot_busy_lock_defers_activation_until_it_is_released(
    registered: str, signing: dict[str, Path], shared_home: Path, tmp_path: Path
) -> None:
    """While the robot's software holds the lock the release is verified, gated and staged
    (deploy exits 1: the device does not run it yet); it goes live once the lock is gone."""
    lock = tmp_path / "robot-busy"
    lock.touch()
    started = start_agent(shared_home, tmp_path, lock_file=lock)
    try:
        staged = deploy(started, shared_home, "--key", str(signing["release"]))
        assert staged.returncode == 1 and "staged" in staged.stderr, staged.stderr[-2000:]
        assert status(started)["active"] is None and status(started)["staged"] is not None
        lock.unlink()
        deadline = time.monotonic() + 30
        while status(started)["active"] is None:
            assert time.monotonic() < deadline, "not activated after the lock was released"
            time.sleep(0.5)
        assert status(started)["active"]["model_version"] == "1"
        assert status(started)["staged"] is None
    finally:
        started["process"].terminate()
        started["process"].wait(timeout=20)


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (the agent's TLS in a lab)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dev-arm-01")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "agent.pem", folder / "agent.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_an_agent_with_tls_is_reached_only_through_its_certificate(
    registered: str, signing: dict[str, Path], shared_home: Path, tmp_path: Path
) -> None:
    from deploy_edge.client import AgentClient
    from deploy_edge.device import DeviceEntry, DeviceError

    cert, key = self_signed_certificate(tmp_path)
    started = start_agent(shared_home, tmp_path, tls_cert=str(cert), tls_key=str(key))
    try:
        os.environ["ARM_TOKEN"] = TOKEN
        url = f"https://127.0.0.1:{started['port']}"
        trusted = DeviceEntry(name="dev-arm-01", url=url, token_env="ARM_TOKEN", ca_cert=cert)
        with AgentClient(trusted) as client:
            assert client.health().device == "dev-arm-01"
            assert client.status().active is None
        stranger = DeviceEntry(name="dev-arm-01", url=url, token_env="ARM_TOKEN")
        with (
            pytest.raises(DeviceError, match="CERTIFICATE_VERIFY_FAILED"),
            AgentClient(stranger) as client,
        ):
            client.health()
    finally:
        started["process"].terminate()
        started["process"].wait(timeout=20)


@pytest.fixture(scope="module")
def precision_versions(
    shared_home: Path, export_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Registered versions of the tiny export with an INT8 variant and a non-candidate
    (``edge-variants``), and of the same bundle marked random weights (``edge-random``)."""
    import dataclasses

    from deploy_edge.bundle.files import write_bundle_checksums
    from deploy_edge.bundle.io_spec import read_io_spec, write_io_spec
    from pipelines import tracking
    from pipelines.registry.exports import register_export
    from pipelines.registry.tags import ONNX_HASH_TAG
    from pipelines.services.settings import configure
    from tests.deploy_edge.variants import with_variants

    os.environ["ROBO_PIPE_HOME"] = str(shared_home)
    configure()
    root = tmp_path_factory.mktemp("precision")
    bundle = with_variants(
        export_dir,
        root / "variants",
        {"name": "int8", "relative_error": 0.02},
        {"name": "int8-wide", "file": "copy", "relative_error": 0.09, "candidate": False,
         "reason": "relative error 9.00% > 5.00%"},
    )  # fmt: skip
    random = root / "random"
    import shutil

    shutil.copytree(bundle, random)
    write_io_spec(random, dataclasses.replace(read_io_spec(random), random_weights=True))
    write_bundle_checksums(random)
    versions = {}
    for name, folder in (("edge-variants", bundle), ("edge-random", random)):
        run = tracking.TrackedRun.start("edge-tests", "register")
        info = register_export(folder, name, run, {ONNX_HASH_TAG: name})
        run.finish()
        versions[name] = f"models:/{name}/{info.version}"
    versions["bundle"] = str(bundle)
    return versions


def test_precision_auto_deploys_the_most_accurate_variant_and_the_table_says_why(
    precision_versions: dict[str, str],
    signing: dict[str, Path],
    shared_home: Path,
    tmp_path: Path,
) -> None:
    """On a local-cpu-auto device both FP32 and INT8 meet 100 ms: FP32 (exact) runs, INT8 is
    less accurate, the non-candidate never ran; the deploy table and the JSON record say so."""
    started = start_agent(shared_home, tmp_path, target="local-cpu-auto")
    try:
        done = robo_pipe(
            "deploy", precision_versions["edge-variants"], "--device", "dev-arm-01", "--devices",
            str(started["devices"]), "--key", str(signing["release"]), "--json",
            home=shared_home, ARM_TOKEN=TOKEN,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        record = json.loads(done.stdout.strip().splitlines()[-1])
        assert record["state"] == "active" and record["variant"] == "fp32"
        trials = {t["variant"]: t for t in record["trials"]}
        assert trials["fp32"]["chosen"] and trials["int8"]["p99_ms"] is not None
        assert trials["int8"]["failure"] == "less accurate than fp32 (2.00% vs 0.00%)"
        assert trials["int8-wide"]["failure"].startswith("not a candidate")
        assert "precision: auto, budget 100 ms" in done.stderr
        assert "less accurate than fp32" in done.stderr and "not a candidate" in done.stderr
        assert "runs edge-variants v1 (fp32)" in done.stderr
        assert status(started)["active"]["variant"] == "fp32"
    finally:
        started["process"].terminate()
        started["process"].wait(timeout=20)


def test_a_random_weights_version_deploys_only_with_systems_test(
    precision_versions: dict[str, str], signing: dict[str, Path], agent: dict[str, Any],
    shared_home: Path,
) -> None:  # fmt: skip
    def deploy_random(*extra: str) -> Any:
        return robo_pipe(
            "deploy", precision_versions["edge-random"], "--device", "dev-arm-01", "--devices",
            str(agent["devices"]), "--key", str(signing["release"]), *extra,
            home=shared_home, ARM_TOKEN=TOKEN,
        )  # fmt: skip

    refused = deploy_random()
    assert refused.returncode == 1 and "random-weights" in refused.stderr, refused.stderr[-2000:]
    assert "--systems-test" in refused.stderr and status(agent)["active"] is None
    done = deploy_random("--systems-test")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "systems test" in done.stderr
    now = status(agent)
    assert now["active"]["systems_test"] and now["last"]["systems_test"]
    fleet = robo_pipe(
        "deploy", precision_versions["edge-random"], "--fleet", "fleet.yaml", "--systems-test",
        home=shared_home,
    )  # fmt: skip
    assert fleet.returncode == 2 and "never to a fleet" in fleet.stderr


def test_robo_pipe_gate_on_an_auto_profile_makes_the_devices_choice_here(
    precision_versions: dict[str, str], shared_home: Path
) -> None:
    """``robo-pipe gate --target local-cpu-auto`` (the pipeline's measure_latency): every
    candidate gated here, the choice and why not the others printed; nothing in the budget
    fails it, naming each p99."""
    quick = ["--target", "local-cpu-auto", "--steps", "20", "--warmup", "2", "--no-pace"]
    bundle = precision_versions["bundle"]
    gate = robo_pipe("gate", bundle, *quick, "--json", home=shared_home)
    assert gate.returncode == 0, gate.stderr[-3000:]
    report = json.loads(gate.stdout.strip().splitlines()[-1])
    assert report["passed"] and report["variant"] == "fp32"
    assert [t["variant"] for t in report["trials"]] == ["fp32", "int8", "int8-wide"]
    assert report["choice"].startswith("fp32: the most accurate candidate within 100 ms")
    assert "precision: auto on local-cpu-auto" in gate.stderr
    assert "less accurate than fp32" in gate.stderr
    tight = robo_pipe("gate", bundle, *quick, "--budget-ms", "0.001", home=shared_home)
    assert tight.returncode == 1, tight.stderr[-3000:]
    shown = tight.stdout + tight.stderr
    assert "no candidate meets the budget 0.001 ms" in shown and "int8: p99" in shown


def test_device_tags_say_which_variant_runs_and_why_not_the_others() -> None:
    from deploy_edge.wire import Deployment, Trial
    from pipelines.deploy.release import variant_tags
    from pipelines.registry.tags import DEVICE_TAG

    done = Deployment("d", "s", "m", "1", 1, "active", variant="int8", systems_test=True)
    done.choice = "int8: the most accurate candidate within 100 ms"
    done.trials = [
        Trial("fp32", "fp32", 0.0, failure="p99 180.00 ms > budget 100 ms", p99_ms=180.0),
        Trial("int8", "int8", 0.02, p99_ms=60.0, chosen=True),
    ]
    tags = variant_tags("arm-1", done)
    prefix = f"{DEVICE_TAG}arm-1."
    assert tags == {
        prefix + "variant": "int8",
        prefix + "choice": "int8: the most accurate candidate within 100 ms; "
        "fp32: p99 180.00 ms > budget 100 ms",
        prefix + "systems_test": "true",
    }
    pinned = Deployment("d", "s", "m", "1", 1, "active", variant="fp32")
    assert variant_tags("arm-1", pinned) == {
        prefix + "variant": "fp32",
        prefix + "choice": "pinned",
    }
    assert variant_tags("arm-1", Deployment("d", "s", "m", "1", 1, "refused")) == {}


def test_the_pipelines_deploy_stage_never_deploys_random_weights(
    precision_versions: dict[str, str], shared_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy stage refuses a random-weights version before any agent starts."""
    from pipelines.config import load_config
    from pipelines.deploy import local_agent
    from pipelines.registry.versions import get_version, parse_model_uri
    from pipelines.services.settings import configure

    def no_agent(*args: Any) -> None:
        raise AssertionError("the local agent was started")

    monkeypatch.setattr(local_agent, "running_local_agent", no_agent)
    configure()
    name, version = parse_model_uri(precision_versions["edge-random"])
    info = get_version(name, version)
    done = local_agent.deploy_to_local_agent(load_config(ROOT / "configs" / "tiny.yaml"), info)
    assert done.state == "refused" and done.p99_ms is None and done.episode_ticks == 0
    assert done.reason.startswith("random weights (systems measurements only)")
