"""The CLI's contract, through the ``robo-pipe`` command in a child process: its exit codes (0
done, 1 a verdict said no, 2 bad input, 3 robo-pipe or a service failed), its output (a
verb's result on stdout, the rest on stderr; with --json the record alone), how it finds its
home (and that read-only verbs create none), and its one grammar (--config, model versions,
--device, --version, -h, an Examples section and the exit codes in every --help)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]
MODEL = "demo-policy"


def robo_pipe(
    *args: str, home: Path | None, cwd: Path = ROOT, **env: str
) -> subprocess.CompletedProcess[str]:
    """``robo-pipe ARGS`` in ``cwd``; ``home``: its $ROBO_PIPE_HOME (None: not set, so the home
    is found from ``cwd``). stdout and stderr are pipes, as in CI."""
    environ = {k: v for k, v in os.environ.items() if k != "ROBO_PIPE_HOME"}
    if home is not None:
        environ["ROBO_PIPE_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=cwd,
        env={**environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder whose home is ``.robo-pipe`` inside it."""
    return tmp_path_factory.mktemp("contract") / "project"


@pytest.fixture(scope="module")
def blocked(project: Path) -> subprocess.CompletedProcess[str]:
    """``robo-pipe run`` on the tiny profile held to a success no tiny policy reaches: its
    candidate is registered, and blocked (about 50 s: every stage runs, on a fresh home)."""
    return robo_pipe(
        "run",
        "--config",
        str(TINY_CONFIG),
        "--set",
        "registry.promotion.min_success=1.0",
        "--json",
        home=project / ".robo-pipe",
    )


def test_run_exits_1_when_its_candidate_is_blocked(
    blocked: subprocess.CompletedProcess[str],
) -> None:
    """The verdict's exit code; stdout holds the --json record alone, the verdict in it."""
    assert blocked.returncode == 1, blocked.stderr[-3000:]
    record = json.loads(blocked.stdout)  # the whole of stdout: one JSON document
    assert not record["promoted"] and record["verdict"] == "blocked"
    assert record["version"] == "1" and "held-out success" in record["blocked_by"]
    assert "verdict: blocked" in blocked.stderr and "Traceback" not in blocked.stderr
    assert "gates for demo-policy v1" in blocked.stderr, "with --json the summary is on stderr"


def test_models_list_prints_its_table_on_stdout_and_json_alone(
    blocked: subprocess.CompletedProcess[str], project: Path
) -> None:
    home = project / ".robo-pipe"
    listed = robo_pipe("models", "list", home=home)  # stdout is a pipe: `| grep demo-policy`
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if MODEL in line]
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [MODEL, "1", "-", "1", "1"], row
    assert MODEL not in listed.stderr
    as_json = robo_pipe("models", "list", "--json", home=home)
    assert as_json.returncode == 0, as_json.stderr
    (model,) = json.loads(as_json.stdout)  # nothing but the record
    assert model["name"] == MODEL and model["versions"][0]["aliases"] == ["candidate"]
    assert MODEL in as_json.stderr, "the table goes to stderr with --json"


def test_a_version_is_named_the_same_way_in_every_form(
    blocked: subprocess.CompletedProcess[str], project: Path
) -> None:
    home = project / ".robo-pipe"
    for form in (f"models:/{MODEL}/1", f"{MODEL}/1", f"{MODEL}@candidate"):
        shown = robo_pipe("models", "show", form, "--json", home=home)
        assert shown.returncode == 0, (form, shown.stderr)
        assert [v["version"] for v in json.loads(shown.stdout)] == ["1"], form
    model = robo_pipe("models", "show", f"models:/{MODEL}", "--json", home=home)  # all versions
    assert [v["version"] for v in json.loads(model.stdout)] == ["1"], model.stderr
    for form in (f"{MODEL}/", f"{MODEL}/candidate", f"{MODEL}@"):
        bad = robo_pipe("models", "show", form, home=home)
        assert bad.returncode == 2 and "models:/NAME@ALIAS" in bad.stderr, (form, bad.stderr)
    refused = robo_pipe("models", "promote", f"models:/{MODEL}/1", home=home)
    assert refused.returncode == 1, refused.stderr  # the gates' verdict, not bad input
    assert "failed gates: held-out success" in refused.stderr


def test_the_home_is_found_from_a_subfolder(
    blocked: subprocess.CompletedProcess[str], project: Path
) -> None:
    """No $ROBO_PIPE_HOME: the nearest .robo-pipe above the working folder, as git finds .git."""
    deep = project / "src" / "deep"
    deep.mkdir(parents=True)
    info = robo_pipe("info", "--json", home=None, cwd=deep)
    assert info.returncode == 0, info.stderr
    found = json.loads(info.stdout)
    assert found["home"] == str(project / ".robo-pipe")
    assert found["home_found"] == f"found in parent {project}"
    listed = robo_pipe("models", "list", home=None, cwd=deep)
    assert any(MODEL in line for line in listed.stdout.splitlines()), listed.stderr
    told = robo_pipe("info", home=project / "elsewhere", cwd=deep)
    assert "from $ROBO_PIPE_HOME" in told.stdout and str(project / "elsewhere") in told.stdout
    assert not (project / "elsewhere").exists()


def test_read_only_verbs_create_nothing_in_an_empty_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    fleet = tmp_path / "fleet.yaml"
    device = {"name": "arm-1", "url": "http://127.0.0.1:9", "token_env": "ARM_TOKEN"}
    fleet.write_text(yaml.safe_dump({"devices": [device]}))
    info = robo_pipe("info", home=None, cwd=empty)
    assert info.returncode == 0, info.stderr
    assert f"{empty / '.robo-pipe'} (new, in the current folder)" in info.stdout
    listed = robo_pipe("models", "list", "--json", home=None, cwd=empty)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert "no registry yet" in listed.stderr
    shown = robo_pipe("models", "show", MODEL, home=None, cwd=empty)
    assert shown.returncode == 2 and "no registry yet" in shown.stderr
    for verb in (["config"], ["robots"], ["scenes"]):
        done = robo_pipe(*verb, home=None, cwd=empty, ARM_TOKEN="t")
        assert done.returncode == 0, (verb, done.stderr)
    status = robo_pipe(
        "fleet", "status", "--fleet", str(fleet), home=None, cwd=empty, ARM_TOKEN="t"
    )
    assert status.returncode == 1 and "unreachable: arm-1" in status.stderr, status.stderr
    missing = robo_pipe("verify", "nothing-here", home=None, cwd=empty)
    assert missing.returncode == 2
    assert list(empty.iterdir()) == [], "no ./.robo-pipe, nothing else"


class FailingMLflow(BaseHTTPRequestHandler):
    """An MLflow tracking server that answers its health check and the login probe, then
    fails every other call with HTTP 500: a service robo-pipe needs, broken."""

    def do_GET(self) -> None:
        ok = self.path == "/health" or self.path.startswith("/api/2.0/mlflow/experiments/search")
        body = json.dumps({"experiments": []} if ok else {"error_code": "INTERNAL_ERROR"})
        self.send_response(200 if ok else 500)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the CLI's output, not the server's."""


@pytest.fixture
def failing_mlflow() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingMLflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_failing_service_exits_3_with_its_traceback(failing_mlflow: str, tmp_path: Path) -> None:
    failed = robo_pipe(
        "models",
        "list",
        home=tmp_path / "home",
        MLFLOW_TRACKING_URI=failing_mlflow,
        MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
    )
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert "Traceback (most recent call last)" in failed.stderr
    assert "INTERNAL_ERROR" in failed.stderr or "500" in failed.stderr


def test_a_service_that_does_not_answer_exits_3_naming_it(tmp_path: Path) -> None:
    """Nothing in the input is wrong when the configured Prefect API is down: 3, not 2, and the
    message names the service and the variable that points at it (no traceback needed)."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = robo_pipe(
        "run",
        "--config",
        str(TINY_CONFIG),
        home=tmp_path / "home",
        PREFECT_API_URL=f"http://127.0.0.1:{port}/api",
    )
    assert down.returncode == 3, down.stderr[-3000:]
    said = " ".join(down.stderr.split())
    assert f"cannot reach the Prefect API at http://127.0.0.1:{port}/api" in said
    assert "PREFECT_API_URL" in said and "Traceback" not in down.stderr


def test_bad_input_exits_2_naming_it_without_a_traceback(tmp_path: Path) -> None:
    for args, named in (
        (["run", "--config", "nowhere.yaml"], "nowhere.yaml: config file not found"),
        (["collect", "--set", "sim.num_envs=-1"], "field 'sim.num_envs' = -1"),
        (["evaluate", "models:/"], "expected models:/NAME@ALIAS"),
        (
            ["run", "--set", "evaluate.delay.inference_ms=300"],
            "'evaluate.delay.inference_ms = 300'",
        ),
        (["run", "--no-such-option"], "No such option"),  # a usage error
    ):
        done = robo_pipe(*args, home=tmp_path / "home")
        assert done.returncode == 2, (args, done.stderr)
        assert named in " ".join(done.stderr.split()), (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "home").exists(), "refused before anything was made"


def test_old_grammar_is_refused_naming_the_new(tmp_path: Path) -> None:
    """Each form of the grammar before issue 35 exits 2 and says what to write instead."""
    home = tmp_path / "home"
    for args, instead in (
        (["run", "configs/tiny.yaml"], "run --config configs/tiny.yaml"),
        (["models", "check", "configs/tiny.yaml"], "check --config configs/tiny.yaml"),
        (["demo", "configs/demo.yaml"], "robo-pipe expert"),
        (["edge-agent", "--config", "device.yaml"], "--device-config device.yaml"),
        (["deploy", f"models:/{MODEL}@champion", "--target", "arm-1"], "--device arm-1"),
        (["models", "promote", MODEL, "3"], f"models:/{MODEL}/3"),
        (["fleet", "status", "fleet.yaml"], "status --fleet fleet.yaml"),
    ):
        done = robo_pipe(*args, home=home)
        assert done.returncode == 2, (args, done.stderr)
        assert instead in " ".join(done.stderr.split()), (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_version_and_short_help(tmp_path: Path) -> None:
    shown = robo_pipe("--version", home=tmp_path / "home")
    assert shown.returncode == 0 and shown.stdout.strip() == f"robo-pipe {version('robo-pipe')}"
    for args in (["-h"], ["run", "-h"], ["models", "-h"], ["models", "show", "-h"]):
        helped = robo_pipe(*args, home=tmp_path / "home")
        assert helped.returncode == 0 and "Usage:" in helped.stdout, args


def command_paths() -> list[list[str]]:
    """Every visible command and group of the CLI, as the words that name it."""
    import typer.main

    from pipelines.cli import app

    found: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        found.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def test_every_help_ends_with_examples_and_the_exit_codes(tmp_path: Path) -> None:
    """Every --help ends with its examples and the exit codes, and lists a flag (``--json``,
    ``--help``) by its name alone: it takes no value, so no type (typer's rich help would
    print ``<bool>``)."""
    from typer.testing import CliRunner

    from pipelines.cli import app

    paths = command_paths()
    assert ["models", "promote"] in paths and ["expert"] in paths and ["demo"] not in paths

    # In this process: the text is the same app's as a `robo-pipe ... --help` process prints
    # (test_version_and_short_help checks four through the CLI), without ~40 CLI start-ups.
    runner = CliRunner()
    env = {"COLUMNS": "200", "ROBO_PIPE_HOME": str(tmp_path / "home")}
    for path in paths:
        helped = runner.invoke(app, [*path, "--help"], env=env, prog_name="robo-pipe")
        assert helped.exit_code == 0, (path, helped.output)
        text = helped.stdout
        examples = text.split("Examples")[-1].split("Exit codes")[0]
        assert f"robo-pipe {' '.join(path)}".strip() in examples, (path, text)
        assert "<bool>" not in text, (path, text)
        codes = text.split("Exit codes")[-1]
        for code in ("0 done", "1 a verdict said no", "2 bad input", "3 robo-pipe"):
            assert code in " ".join(codes.split()), (path, code)
