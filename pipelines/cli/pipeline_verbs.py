"""The pipeline verbs: run (the whole flow, live), serve (its schedules), ui, info."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from pipelines.cli.common import (
    console,
    emit_json,
    load,
    quiet_prefect_console,
    result_console,
    services,
)
from pipelines.cli.display import live
from pipelines.cli.options import DEMO_CONFIG, ConfigOpt, JsonOpt, RayAddressOpt, SetOpt, add_verb
from pipelines.cli.result_tables import show_pipeline_result
from pipelines.run.expected import expected_line, first_run
from pipelines.steps import checks
from robo_pipe.errors import InputError, RoboPipeError


def run(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also print Prefect's flow and task logs.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run the whole pipeline: collect, pretrain (cached), fine-tune, export, evaluate the export,
    latency gate, register in MLflow; champion moves only if every gate passes.

    Each stage is a Prefect task (see them in `robo-pipe ui`); everything is logged to one MLflow
    run. Re-running after a failure or Ctrl-C reuses the completed stages and continues from the
    one that did not finish. Ends with the registered version, its gates, and where to look,
    and exits 0 only when the candidate was promoted (and the device, if any, took it).
    """
    cfg = load(config, set_)  # a bad config stops here, before anything starts
    checks.check_config(cfg)  # read and checked once: the flow takes it as it is
    if not verbose:
        quiet_prefect_console()
    stop_survivors()
    found = services(flows=True, ray_address=ray_address)
    if note := found.servers_note():
        console.print(note, highlight=False)
    console.print(
        f"pipeline [bold]{cfg.name}[/] (config hash {cfg.config_hash()}): Prefect "
        f"{found.prefect_api_url or 'temporary local server (robo-pipe ui shows its runs)'}, "
        f"MLflow {found.mlflow_tracking_uri}",
        highlight=False,
    )
    if (measured := first_run(cfg)) is not None:  # a shipped config: what its stages take
        console.print(expected_line(measured), highlight=False, soft_wrap=True)
    from pipelines.services.local_servers import begin_temporary_prefect_server

    # Without a configured server: Prefect's temporary one, started now in a session of its
    # own that stops when this process ends, however it ends (the parent-death signal). It
    # boots while this process imports what the stages need.
    prefect_ready = begin_temporary_prefect_server()
    from pipelines.progress import listening
    from pipelines.run.flow import train_simulate_deploy
    from pipelines.services.signals import (
        ServerLost,
        drop_unsent_if_server_gone,
        interrupted_exit_code,
        prefect_server_gone,
        sigterm_kept_in_flows,
        stop_if_server_goes,
        stop_on_sigterm,
    )

    warm_imports()
    prefect_ready()
    # Until here SIGTERM ends the process at once (exit 143 too; the temporary server with it).
    stop_on_sigterm()
    again = "start it again (or send runs elsewhere), then the same command resumes the run"
    start = time.perf_counter()
    try:
        with (
            sigterm_kept_in_flows(),
            stop_if_server_goes(found),
            live() as display,
            listening(display),
        ):
            result = train_simulate_deploy(config=cfg, ray_address=ray_address)
    except KeyboardInterrupt as stopped:
        if isinstance(stopped, ServerLost):
            console.print(f"[red]{stopped.reason}[/]: run stops; {again}", highlight=False)
        else:
            console.print("[yellow]interrupted[/]: run the same command again to resume")
        raise typer.Exit(code=interrupted_exit_code(stopped)) from None
    except RoboPipeError:
        raise
    except Exception:
        if lost := prefect_server_gone(found):  # a call to it failed before the watch saw it
            console.print(f"[red]{lost}[/]: run stops; {again}", highlight=False)
            raise typer.Exit(code=3) from None
        console.print(
            "[red]pipeline failed[/]; completed stages are kept: run the same command again to "
            "resume (--verbose shows the full log)"
        )
        raise
    finally:
        if dropped := drop_unsent_if_server_gone(found):
            console.print(f"{dropped} log and event records could not be sent to Prefect")
    show_pipeline_result(result, time.perf_counter() - start, found, result_console(json_out))
    emit_json({**result.to_json(), "verdict": result.verdict}, json_out)
    if result.verdict != "promoted":
        console.print(f"[red]verdict: {result.verdict}[/]: exit code 1", highlight=False)
        raise typer.Exit(code=1)
    console.print(f"[green]verdict: {result.verdict}", highlight=False)


def warm_imports() -> None:
    """Import what every run's stages load (~4 s on a quiet core: torch and peft through the
    checkpoint module, MLflow, matplotlib) while the temporary Prefect server boots in its own
    process, rather than after it."""
    import matplotlib

    matplotlib.use("Agg")  # headless, as every plot of a run is drawn
    import matplotlib.pyplot
    import mlflow  # noqa: F401

    import stages.policy.checkpoint  # noqa: F401


def serve(
    config: ConfigOpt = DEMO_CONFIG,
    set_: SetOpt = None,
    ray_address: RayAddressOpt = None,
) -> None:
    """Register the config's schedules as Prefect deployments and run their flow runs until
    Ctrl-C or SIGTERM.

    schedules: in the config lists them, e.g. a nightly train_simulate_deploy on cron
    "0 2 * * *" in Europe/Berlin and an hourly champion_regression. Scheduled runs and runs
    started from the Prefect UI or API execute here, one per deployment at a time. Without
    PREFECT_API_URL or a running `robo-pipe ui`, a local Prefect server and MLflow UI are
    started for as long as this runs (a schedule needs a server's scheduler), and stopped
    with it.
    """
    from pipelines.services.local_servers import LocalServers
    from pipelines.services.settings import use_prefect_api
    from pipelines.services.signals import interrupted_exit_code, stop_on_sigterm

    cfg = load(config, set_)
    if not cfg.schedules:
        raise InputError(f"{config}: field 'schedules' is empty: nothing to serve")
    checks.check_config(cfg)
    stop_survivors()
    found = services()
    servers = None
    exit_code = 0
    stop_on_sigterm()
    start = time.perf_counter()
    try:
        if found.prefect_api_url is None:
            servers = LocalServers(owner="robo-pipe serve")
            with console.status("starting the Prefect server and the MLflow UI"):
                servers.start()
            use_prefect_api(f"{servers.prefect_url}/api")
            console.print(
                f"Prefect UI {servers.prefect_url}   MLflow UI {servers.mlflow_url}",
                highlight=False,
            )
            console.print(servers.capture_note(), style="dim", highlight=False)
        else:
            console.print(
                found.servers_note() or f"Prefect API {found.prefect_api_url}", highlight=False
            )
        from pipelines.serve.deployments import OVERLAP, build_deployments, describe_schedule
        from pipelines.serve.deployments import serve as serve_deployments

        deployments = build_deployments(cfg, config, list(set_ or []), ray_address)
        for entry in cfg.schedules:
            overlap = "waits" if OVERLAP[entry.flow] == "ENQUEUE" else "is skipped"
            console.print(
                f"serving {entry.flow}/{entry.name} {describe_schedule(entry)} "
                f"(a run that starts while one runs {overlap})",
                highlight=False,
            )
        prefect_ui = servers.prefect_url if servers else found.prefect_ui
        console.print(
            f"next runs: {prefect_ui}/deployments (each one's Upcoming tab); Ctrl-C or SIGTERM "
            "stops serving",
            style="dim",
            highlight=False,
        )
        serve_deployments(
            deployments,
            servers,
            found.servers_of,
            say=lambda line: console.print(line, style="yellow", highlight=False),
        )
    except KeyboardInterrupt as stopped:
        exit_code = interrupted_exit_code(stopped)
    finally:
        stopping = time.perf_counter()
        if servers:
            servers.stop()
        console.print(
            f"stopped after {stopping - start:.0f} s (shutdown took "
            f"{time.perf_counter() - stopping:.1f} s)"
        )
    raise typer.Exit(code=exit_code)


def ui(
    prefect_port: Annotated[
        int,
        typer.Option(
            help="Prefect server port (next free if taken).", envvar="ROBO_PIPE_PREFECT_PORT"
        ),
    ] = 4200,
    mlflow_port: Annotated[
        int,
        typer.Option(help="MLflow UI port (next free if taken).", envvar="ROBO_PIPE_MLFLOW_PORT"),
    ] = 5000,
) -> None:
    """Start the local Prefect server and the MLflow UI on 127.0.0.1 and print their URLs.

    Both show this home's runs (earlier ones too). While this runs, `robo-pipe run` and
    `robo-pipe serve` on this home report to these servers, so their stages appear live (ui and
    they say so). Ctrl-C or SIGTERM stops both.
    """
    from pipelines.services.local_servers import LocalServers
    from pipelines.services.signals import interrupted_exit_code, stop_on_sigterm
    from pipelines.tracking import mlflow_page

    stop_survivors()
    servers = LocalServers(prefect_port, mlflow_port)
    stop_on_sigterm()
    try:
        with console.status("starting the Prefect server and the MLflow UI"):
            servers.start()
        console.print(f"Prefect UI  {servers.prefect_url}", highlight=False)
        # The experiments page in MLflow's model-training view (a fresh browser opens GenAI's).
        mlflow_ui = mlflow_page(servers.mlflow_url, "experiments")
        console.print(f"MLflow UI   {mlflow_ui}", highlight=False)
        console.print(servers.capture_note(), highlight=False)
        console.print("Ctrl-C or SIGTERM stops both", style="dim")
        while all(p.poll() is None for p in servers.processes):
            time.sleep(1)
        console.print("[red]a server exited[/]; see the logs under $ROBO_PIPE_HOME")
        exit_code = 3  # a service robo-pipe needs failed
    except KeyboardInterrupt as stopped:
        exit_code = interrupted_exit_code(stopped)
    finally:
        servers.stop()
    raise typer.Exit(code=exit_code)


def info(json_out: JsonOpt = False) -> None:
    """Print the home (and how it was found), the MLflow tracking URI and the Prefect API URL
    this machine uses, and where that Prefect server answers, each served schedule's last run,
    its state, the next run and whether it is stalled (with why). Creates nothing, starts
    no server.

    The home is $ROBO_PIPE_HOME if set, else the nearest .robo-pipe folder in the current
    folder or one of its parents, else ./.robo-pipe (created by the first verb that writes).
    """
    from pipelines.home import locate_home
    from pipelines.services.settings import configure

    home = locate_home()
    found = configure(create=False)
    table = Table(show_header=False, title="robo-pipe")
    table.add_row("home", f"{found.home} ({home.found})")
    table.add_row("MLflow tracking URI", found.mlflow_tracking_uri)
    table.add_row("MLflow UI", found.mlflow_ui or "not running (robo-pipe ui starts one)")
    table.add_row(
        "Prefect API",
        found.prefect_api_url or "temporary local server per run (no PREFECT_API_URL)",
    )
    table.add_row("Prefect UI", found.prefect_ui or "not running (robo-pipe ui starts one)")
    table.add_row("Prefect home", found.prefect_home)
    health, where = _schedule_health(found.prefect_api_url)
    for schedule in health:
        table.add_row(f"schedule {schedule.deployment}", schedule.line().split(": ", 1)[1])
    if where:
        table.add_row("schedules", where)
    result_console(json_out).print(table)
    schedules = [{**h.to_json(), "line": h.line()} for h in health]
    emit_json({**found.to_json(), "home_found": home.found, "schedules": schedules}, json_out)


def _schedule_health(api: str | None) -> tuple[list[Any], str | None]:
    """The health of the served schedules on the Prefect API in use, read only where one
    answers (``info`` starts no server); else where to look."""
    from pipelines.services.settings import healthy

    if api is None or not healthy(f"{api.rstrip('/')}/health"):
        where = f"Prefect API {api} not answering" if api else "no Prefect server running"
        return (
            [],
            f"{where}: `robo-pipe serve` prints each schedule's health (or start `robo-pipe ui`)",
        )
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from pipelines.serve.schedule_health import schedule_health

    with temporary_settings({PREFECT_API_URL: api, PREFECT_CLIENT_MAX_RETRIES: 0}):
        health = schedule_health()
    return health, None if health else f"no robo-pipe schedule on {api}"


def stop_survivors() -> None:
    """Stop the servers of this home that outlived the verb that started them, one line each
    (:func:`pipelines.services.local_servers.stop_survivors`): run, serve and ui call it first."""
    from pipelines.services.local_servers import stop_survivors as stop_them

    for line in stop_them():
        console.print(line, style="yellow", highlight=False)


def register(app: typer.Typer) -> None:
    """Add these verbs to ``app``."""
    add_verb(
        app,
        run,
        "robo-pipe run",
        "robo-pipe run --config configs/tiny.yaml --json > result.json",
        "robo-pipe run -c configs/rl-demo.yaml --ray-address auto",
    )
    add_verb(app, serve, "robo-pipe serve", "robo-pipe serve --config my-schedules.yaml")
    add_verb(app, ui, "robo-pipe ui", "robo-pipe ui --prefect-port 4300 --mlflow-port 5100")
    add_verb(app, info, "robo-pipe info", "robo-pipe info --json")
