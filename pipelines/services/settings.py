"""Where the pipeline's services are: the Prefect API, the MLflow tracking server, and the local
servers of a running ``robo-pipe ui``; the checks that they answer.

Embedded default (nothing configured):

- **MLflow**: ``sqlite:///$ROBO_PIPE_HOME/mlflow/mlflow.db``, artifacts under
  ``$ROBO_PIPE_HOME/mlflow/artifacts``. ``MLFLOW_TRACKING_URI`` points at any MLflow server.
- **Prefect**: ``PREFECT_HOME=$ROBO_PIPE_HOME/prefect``. If ``PREFECT_API_URL`` is set, flows
  report there; else, if ``robo-pipe ui`` is running, to its server (so runs appear live in its
  UI); else Prefect starts a temporary local server on the same SQLite database, and
  ``robo-pipe ui`` shows those runs later.

:func:`configure` sets the environment both read. Prefect also keeps a process-wide copy of its
settings, made when it is first imported (loading a config with a cron schedule imports it): a
command that configures after that calls :func:`refresh_prefect_settings` (and
:func:`use_prefect_api` does). A stale copy has no API URL, and Prefect then quietly starts a
temporary server of its own for part of the work: the served runner's concurrency leases went
there, and every run ``robo-pipe serve`` started ended Cancelled.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

from pipelines.home import default_tracking_uri, home_dir, home_path, robo_pipe_home
from pipelines.services.processes import same_process
from robo_pipe.errors import InputError, ServiceFailure

SERVICES_FILE = "services.json"
"""Written under the home by ``robo-pipe ui`` (and ``serve`` when it starts its own servers):
the URLs of its servers, its pid and which verb it is."""


class ServiceError(ServiceFailure, RuntimeError):
    """A configured service (Prefect API, MLflow tracking server) cannot be reached."""


@dataclass(frozen=True)
class Services:
    """What this process uses (``robo-pipe info`` prints it)."""

    home: str
    mlflow_tracking_uri: str
    mlflow_ui: str | None
    """The MLflow UI serving that store, when one is known: the tracking server itself, or
    for the embedded store the UI of a running ``robo-pipe ui``."""
    prefect_api_url: str | None
    """None: a temporary local Prefect server per process (ephemeral mode)."""
    prefect_ui: str | None
    prefect_home: str
    servers_of: str | None = None
    """The process whose local servers this one reports to, e.g. ``robo-pipe ui (pid 4321)``:
    a ``robo-pipe ui`` (or ``serve``) running on this home, found through its ``services.json``.
    None if it uses none."""

    def to_json(self) -> dict[str, str | None]:
        """Plain-dict form for JSON output."""
        return asdict(self)

    def servers_note(self) -> str | None:
        """What ``run`` and ``serve`` say when they use another process's servers (None if they
        do not): that process and the URLs, so a run that shows up in someone's UI is no
        surprise."""
        if self.servers_of is None:
            return None
        return (
            f"using the servers of {self.servers_of} on this home: Prefect UI {self.prefect_ui}, "
            f"MLflow UI {self.mlflow_ui or '-'} (stop it, or set PREFECT_API_URL, to use others)"
        )


def configure(create: bool = True) -> Services:
    """Set the environment Prefect and MLflow read (only what the user has not set) and return
    where everything is. Call before importing either. ``create=False`` (the read-only verbs):
    create nothing, not even the home."""
    _default("PREFECT_HOME", str(home_dir("prefect") if create else home_path("prefect")))
    _default("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives the temporary server it starts per run 20 s; on a cold machine a first
    # start (imports, database) took longer, and the run failed before any stage.
    _default("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    _default("MLFLOW_DISABLE_TELEMETRY", "true")
    _default("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if create:  # the embedded store's folder (check_services looks for it)
        home_dir("mlflow")
    _default("MLFLOW_TRACKING_URI", default_tracking_uri())
    ui = running_ui()
    if ui:
        _default("PREFECT_API_URL", ui["prefect_api_url"])
    api = os.environ.get("PREFECT_API_URL") or None
    # PREFECT_UI_URL: where the UI is when it is not the API's server without /api (Cloud).
    prefect_ui = os.environ.get("PREFECT_UI_URL") or (api.removesuffix("/api") if api else None)
    tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
    if urlparse(tracking_uri).scheme in ("http", "https"):
        mlflow_ui: str | None = tracking_uri.rstrip("/")  # a tracking server is its own UI
    else:
        mlflow_ui = ui["mlflow_ui"] if ui and _is_default_store() else None
    servers_of = None
    if ui and (api == ui["prefect_api_url"] or mlflow_ui == ui["mlflow_ui"]):
        servers_of = f"{ui.get('owner', 'robo-pipe ui')} (pid {ui['pid']})"
    return Services(
        home=str(robo_pipe_home()),
        mlflow_tracking_uri=tracking_uri,
        mlflow_ui=mlflow_ui,
        prefect_api_url=api,
        prefect_ui=prefect_ui,
        prefect_home=os.environ["PREFECT_HOME"],
        servers_of=servers_of,
    )


def use_prefect_api(url: str) -> None:
    """Send this process's Prefect calls, and those of the processes it starts, to the API at
    ``url`` (e.g. the server ``robo-pipe serve`` started)."""
    os.environ["PREFECT_API_URL"] = url
    refresh_prefect_settings()


def refresh_prefect_settings() -> None:
    """Make an already imported Prefect re-read its process-wide settings from the environment
    (see the module docstring); nothing to do if Prefect is not imported yet. For commands
    only: under ``prefect_test_harness`` it would replace the harness's settings."""
    if "prefect.context" not in sys.modules:
        return
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()


def no_prefect_retries() -> None:
    """From now on, this process's Prefect calls (and those of processes it starts) fail at once
    instead of retrying: for the way out when the Prefect server is gone, where each call would
    otherwise retry for about a minute (``PREFECT_CLIENT_MAX_RETRIES``, 5 with backoff)."""
    os.environ["PREFECT_CLIENT_MAX_RETRIES"] = "0"
    refresh_prefect_settings()


_set_by_us: dict[str, str] = {}


def _default(name: str, value: str) -> None:
    """Set ``name`` unless the user did (a value this module set earlier is ours to change:
    the home may have changed since)."""
    if not os.environ.get(name) or os.environ[name] == _set_by_us.get(name):
        os.environ[name] = value
        _set_by_us[name] = value


def _is_default_store() -> bool:
    return os.environ.get("MLFLOW_TRACKING_URI") == default_tracking_uri()


def check_services(services: Services) -> None:
    """Raise :class:`ServiceError` naming the first configured service that does not answer."""
    if services.prefect_api_url:
        _check_http(
            f"{services.prefect_api_url.rstrip('/')}/health", "Prefect API", "PREFECT_API_URL"
        )
    uri = services.mlflow_tracking_uri
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        _check_http(f"{uri.rstrip('/')}/health", "MLflow tracking server", "MLFLOW_TRACKING_URI")
        _check_mlflow_login(uri.rstrip("/"))
    elif scheme == "sqlite":
        parent = Path(uri.removeprefix("sqlite:///")).parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise InputError(
                f"MLflow tracking URI {uri!r}: directory {parent} does not exist or is not "
                "writable (set MLFLOW_TRACKING_URI)"
            )


def _check_http(url: str, what: str, variable: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            if response.status >= 400:
                raise ServiceError(f"{what} at {url} answered HTTP {response.status}")
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        reason = getattr(err, "reason", err)
        raise ServiceError(
            f"cannot reach the {what} at {url.rsplit('/', 1)[0]} ({reason}); is it running? "
            f"(set by {variable})"
        ) from None


_joined: set[tuple[str, str]] = set()


def join_cluster(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (nothing if None: stages start a local Ray) and
    check, once per process and home, that each of its nodes shares the home with this machine
    (:func:`stages.ray_runtime.check_shared_storage`): the stages hand each other files there.
    Raises :class:`stages.ray_runtime.RayClusterError` (a named error) otherwise."""
    if not address:
        return
    from stages.ray_runtime import check_shared_storage, init_ray

    home = robo_pipe_home()
    init_ray(address)
    if (address, str(home)) not in _joined:
        check_shared_storage(home)
        _joined.add((address, str(home)))


def _check_mlflow_login(uri: str) -> None:
    """Raise :class:`InputError` if the MLflow server at ``uri`` refuses this process's
    credentials (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD`` for MLflow's basic auth, or
    ``MLFLOW_TRACKING_TOKEN``), as the MLflow client sends them: one read-only API call."""
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1")
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if user:
        login = f"{user}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}".encode()
        request.add_header("Authorization", f"Basic {base64.b64encode(login).decode()}")
    elif token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10):
            return
    except urllib.error.HTTPError as err:
        if err.code == 401 and user:
            why = (
                f"refused the login of MLFLOW_TRACKING_USERNAME={user!r} (HTTP 401): check "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
            )
        elif err.code == 401:
            why = (
                "needs a login (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
            )
        elif err.code == 403:
            why = f"does not let {user or 'this client'} read experiments (HTTP 403)"
        else:
            return  # the server's own business; the MLflow client reports it if it matters
    except (urllib.error.URLError, OSError, TimeoutError):
        return  # /health answered a moment ago; a real outage shows in the first MLflow call
    raise InputError(f"the MLflow tracking server at {uri} {why}")  # the login is input


def healthy(url: str) -> bool:
    """True if ``url`` answers with a status below 400 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status < 400)
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def running_ui() -> dict[str, str] | None:
    """The servers a live ``robo-pipe ui`` started for this home, if it is still serving."""
    path = robo_pipe_home() / SERVICES_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
    except (ValueError, KeyError, OSError):
        return None
    if not same_process(int(state["pid"]), state.get("owner_start")):
        return None  # its owner died and the pid went to another process
    if not healthy(f"{state['prefect_api_url']}/health"):
        return None
    return {k: str(v) for k, v in state.items() if not isinstance(v, list)}
