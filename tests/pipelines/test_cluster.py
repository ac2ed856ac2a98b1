"""Scale-out the way an operator runs it (README, "Running on a cluster"): every service is its
own process, started by hand on 127.0.0.1, and robo-pipe reaches them through the CLI only.

- Ray: a head node and a worker node (``ray start``, one CPU each, so that two workers of a
  stage land on two nodes) with token authentication on.
- Prefect: ``prefect server start`` on its own database.
- MLflow: ``mlflow server`` with basic auth and artifact serving (``--artifacts-destination``):
  the client uploads the model through the server's HTTP proxy, never to a path it shares.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.services.local_servers import free_port
from pipelines.services.settings import healthy
from tests.pipelines import test_scale_out as scale_out
from tests.pipelines.test_flow import CONFIG, MODEL, TINY

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ADMIN = ("admin", "robo-pipe-admin-" + secrets.token_hex(4))  # MLflow wants >= 12 characters

# Two workers in every stage that has them, every parameter trained.
ON_THE_CLUSTER = [
    "collect.workers=2",
    "collect.episodes=8",
    "collect.episodes_per_shard=4",
    "pretrain.bc.workers=2",
    "finetune.bc.workers=2",
    "finetune.trainable=all",
    "evaluate.workers=2",
    "evaluate.episodes=4",
    "evaluate.episodes_per_shard=2",
]


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM the process group (a `ray start --block` takes its node's processes down),
    SIGKILL what is left after ``grace_s`` (a Ray head took 30 s to answer SIGTERM, and what
    it holds is scratch)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def _wait_for(ready: object, what: str, procs: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + 180
    while not ready():  # type: ignore[operator]
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            pytest.fail(f"{what} did not come up: {log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cluster-logs")


@pytest.fixture(scope="module")
def ray_env() -> dict[str, str]:
    """What every process of the cluster and every driver has: token authentication on."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    env.pop("RAY_ADDRESS", None)
    return env


def _nodes(address: str, env: dict[str, str]) -> int:
    probe = "import ray, sys; ray.init(address=sys.argv[1]); print(len(ray.nodes()))"
    done = subprocess.run(
        [sys.executable, "-c", probe, address], env=env, capture_output=True, text=True
    )
    return int(done.stdout.split()[-1]) if done.returncode == 0 else 0


def _ray_node(address: str | None, env: dict[str, str], log: Path, port: int = 0) -> list[str]:
    common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    if address is None:
        return [str(BIN / "ray"), "start", "--head", f"--port={port}", *common,
                "--include-dashboard=false"]  # fmt: skip
    return [str(BIN / "ray"), "start", f"--address={address}", *common]


def _start_head(ray_env: dict[str, str], log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A Ray head node on a free port of 127.0.0.1, up and alone: its address and process
    (stopped by the caller, also when this raises)."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = _start(_ray_node(None, ray_env, log, port), ray_env, log)
    try:
        _wait_for(lambda: _nodes(address, ray_env) == 1, "ray start --head", [head], log)
    except BaseException:
        _stop(head)
        raise
    return address, head


@pytest.fixture(scope="module")
def ray_cluster(ray_env: dict[str, str], logs: Path) -> Iterator[str]:
    """Two Ray nodes on this machine, one CPU each; the head's address."""
    log = logs / "ray.log"
    address, head = _start_head(ray_env, log)
    worker = None
    try:
        worker = _start(_ray_node(address, ray_env, log), ray_env, log)
        _wait_for(lambda: _nodes(address, ray_env) == 2, "the second node", [head, worker], log)
        yield address
    finally:
        for proc in filter(None, (worker, head)):
            _stop(proc)


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory: pytest.TempPathFactory, logs: Path) -> Iterator[str]:
    """`prefect server start` with its own PREFECT_HOME; its API URL."""
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect-server")),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    cmd = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    server = _start(cmd, env, logs / "prefect.log")
    api = f"http://127.0.0.1:{port}/api"
    try:
        _wait_for(
            lambda: healthy(f"{api}/health"), "prefect server", [server], logs / "prefect.log"
        )
        yield api
    finally:
        _stop(server)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, logs: Path) -> Iterator[dict[str, str]]:
    """`mlflow server` with basic auth and artifact serving; its URI and artifact folder."""
    root = tmp_path_factory.mktemp("mlflow-server")
    auth = root / "basic_auth.ini"
    auth.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\nadmin_username = {ADMIN[0]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(auth),
        "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    port = free_port()
    cmd = [str(BIN / "mlflow"), "server", "--app-name", "basic-auth"]
    cmd += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
    cmd += ["--artifacts-destination", str(root / "artifacts")]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    server = _start(cmd, env, logs / "mlflow.log")
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: healthy(f"{uri}/health"), "mlflow server", [server], logs / "mlflow.log")
        yield {"uri": uri, "artifacts": str(root / "artifacts")}
    finally:
        _stop(server)


def robo_pipe(*args: str, home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return scale_out.robo_pipe(*args, home=home, env=env, timeout=900)  # a whole pipeline run


def test_the_pipeline_on_a_two_node_cluster_with_remote_prefect_and_mlflow_servers(
    tmp_path: Path,
    ray_cluster: str,
    ray_env: dict[str, str],
    prefect_api: str,
    mlflow_server: dict[str, str],
) -> None:
    home = tmp_path / "home"
    env = {
        **ray_env,
        "PREFECT_API_URL": prefect_api,
        "MLFLOW_TRACKING_URI": mlflow_server["uri"],
        "MLFLOW_TRACKING_USERNAME": ADMIN[0],
        "MLFLOW_TRACKING_PASSWORD": ADMIN[1],
    }
    prefect_ui = prefect_api.removesuffix("/api")

    info = robo_pipe("info", "--json", home=home, env=env)
    found = json.loads(info.stdout.strip().splitlines()[-1])
    assert found["mlflow_ui"] == mlflow_server["uri"], "the tracking server is the MLflow UI"
    assert found["prefect_ui"] == prefect_ui

    # Mistakes an operator makes are named before any stage.
    sets = [arg for s in [*TINY, *ON_THE_CLUSTER] for arg in ("--set", s)]
    run = ["run", "--config", CONFIG, *sets, "--ray-address", ray_cluster]
    wrong = robo_pipe(*run, home=home, env={**env, "MLFLOW_TRACKING_PASSWORD": "not-the-one"})
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "refused the login of MLFLOW_TRACKING_USERNAME='admin'" in " ".join(wrong.stderr.split())
    no_token = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    refused = robo_pipe(*run, home=home, env=no_token)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "it has token authentication on. Set RAY_AUTH_MODE=token" in " ".join(
        refused.stderr.split()
    )
    bad_token = robo_pipe(*run, home=home, env={**env, "RAY_AUTH_TOKEN": "0" * 32})
    assert bad_token.returncode == 2, bad_token.stderr[-2000:]
    assert "it refused this machine's token" in " ".join(bad_token.stderr.split())
    assert "Traceback" not in wrong.stderr + refused.stderr + bad_token.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir()), "no stage ran"

    done = robo_pipe(*run, "--json", home=home, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    # The work of every stage ran on both nodes.
    provenance = json.loads((Path(result["dataset"]) / "meta/robo_pipe.json").read_text())
    trained = json.loads((Path(result["checkpoint"]).parent / "checkpoint_ref.json").read_text())
    evaluated = json.loads((Path(result["run_dir"]) / "evaluate/eval_report.json").read_text())
    (base,) = home.glob("checkpoints/base-*/checkpoint_ref.json")
    where = {
        "collect": provenance["collected_on"],
        "pretrain": json.loads(base.read_text())["worker_nodes"],
        "fine-tune": trained["worker_nodes"],
        "evaluate": evaluated["nodes"],
    }
    for stage, nodes in where.items():
        assert len(set(nodes) - {""}) == 2, f"{stage} ran on {nodes}"

    # The links point to the servers; none to a UI of robo-pipe's own.
    links = result["links"]
    assert links["Prefect flow run"].startswith(f"{prefect_ui}/runs/flow-run/")
    assert links["MLflow model version"].startswith(f"{mlflow_server['uri']}/#/models/{MODEL}/")
    assert links["MLflow run"].startswith(f"{mlflow_server['uri']}/#/experiments/")
    for url in links.values():
        assert url in done.stdout or json.dumps(url) in done.stdout
    assert "robo-pipe ui" not in done.stdout

    # The flow run is Completed in that Prefect server.
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as api:
        flow_run = api.read_flow_run(links["Prefect flow run"].rsplit("/", 1)[1])
        assert flow_run.state is not None and flow_run.state.is_completed()

    # The model version is in that MLflow server; its files went through the server's
    # artifact proxy into --artifacts-destination, and load back through models:/.
    code = (
        "import json, mlflow, sys; c = mlflow.MlflowClient();"
        "v = c.get_model_version_by_alias(sys.argv[1], 'champion');"
        "path = mlflow.artifacts.download_artifacts(f'models:/{sys.argv[1]}/{v.version}');"
        "print(json.dumps([v.version, v.description, path, c.get_run(v.run_id).info.artifact_uri]))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code, MODEL], env=env, capture_output=True, text=True
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    version, description, path, stored = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert version == str(result["version"])
    assert stored.startswith("mlflow-artifacts:/"), f"{stored}: not through the server's proxy"
    assert all(url in description for url in links.values()), description
    assert any(Path(path).rglob("*.onnx")), "the exported policy came back through models:/"
    assert any(Path(mlflow_server["artifacts"]).rglob("*.onnx")), "stored by the server"
    assert not (home / "mlflow" / "mlflow.db").exists(), "nothing went to the embedded store"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_node_that_does_not_see_the_home_is_named_before_any_stage(
    tmp_path: Path, ray_env: dict[str, str], logs: Path
) -> None:
    """A node whose ROBO_PIPE_HOME is its own disk: here, a private mount namespace with an
    empty tmpfs over the home (as a node without the NFS mount would have)."""
    home = tmp_path / "home"
    home.mkdir()
    log = logs / "ray-unshared.log"
    address, head = _start_head(ray_env, log)
    lone = None
    try:
        inner = " ".join(_ray_node(address, ray_env, log))
        mount = f"mount -t tmpfs none {home} && exec {inner}"
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount]
        if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
            pytest.skip("this machine does not allow a private mount namespace (unshare)")
        lone = _start(cmd, ray_env, log)
        _wait_for(lambda: _nodes(address, ray_env) == 2, "the unshared node", [head, lone], log)
        sets = [arg for s in TINY for arg in ("--set", s)]
        env = {**ray_env, "PREFECT_API_URL": ""}
        done = robo_pipe(
            "collect", "-c", CONFIG, *sets, "--set", "collect.workers=2", "--ray-address", address,
            home=home, env=env,
        )  # fmt: skip
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        error = " ".join(done.stderr.split())
        assert f"does not share {home} with this machine" in error
        assert "No such file or directory" in error and "NFS" in error
        assert not list(home.glob("datasets/*")), "nothing was collected"
        assert not any((home / ".cluster-probe").iterdir()), "the probe cleaned up after itself"
    finally:
        for proc in filter(None, (lone, head)):
            _stop(proc)
