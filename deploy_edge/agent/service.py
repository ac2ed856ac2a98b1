"""The edge agent's HTTP service: what ``robo-pipe deploy`` talks to on a device.

Endpoints (JSON; every one but ``/healthz`` needs ``Authorization: Bearer <token>``, a token
whose sha256 the device config lists under a scope that allows the call: ``read`` < ``deploy``
< ``operate``, see :data:`deploy_edge.agent.config.SCOPES`; a refusal answers 401/403 naming
the scope needed and is logged, never the token)::

    GET  /healthz                      liveness (no token): {"ok": true, "device": name}
    GET  /uploads                      every upload: sha256, received, size, age (read)
    GET  /uploads/{sha256}             that upload: bytes received so far, its size (read)
    PUT  /uploads/{sha256}?offset=N&size=S
                                       append a chunk at byte N of a release of S bytes (a cut
                                       upload resumes at the bytes the agent has; a wrong offset
                                       answers 409 with it); refused (413) past max_release_mb
                                       or the free-space margin; hashed when complete, deleted
                                       (422) when the hash is wrong (deploy; rules:
                                       :class:`~deploy_edge.agent.uploads.UploadStore`)
    DELETE /uploads/{sha256}           delete an upload, partial or complete (deploy)
    POST /pieces/missing               {"pieces": [sha256, ...]}: those the device neither
                                       holds in a slot nor was sent (read; delta uploads:
                                       :mod:`deploy_edge.agent.pieces`)
    PUT  /pieces                       a batch of pieces (a JSON line [[sha256, size], ...],
                                       then their bytes; at most 8 MiB); a piece whose bytes
                                       hash otherwise is refused (422) and not kept (deploy)
    POST /uploads/{sha256}/assemble    {"size", "pieces": [[sha256, size], ...]}: write the
                                       release from held and sent pieces, then as any upload:
                                       complete once it hashes to sha256; 409 names a missing
                                       piece (deploy)
    POST /deployments                  {"sha256", "force", "systems_test", "origin"}: deploy the
                                       uploaded release (in the background; follow it with
                                       /status); ``systems_test`` lets a random-weights release
                                       go live (deploy; with ``force``: operate)
    GET  /status                       active / previous / staged version, lock, running and
                                       last deployment with every step's result (read)
    GET  /history                      every deployment, newest first (read)
    POST /activate                     {"origin"}: activate the staged version (when the lock
                                       is released) (deploy)
    POST /rollback                     {"release", "origin"}: back to the previous version (only
                                       if it is ``release``, when given); 409 when there is none
                                       or it is another release (deploy)
    POST /unstage                      {"origin"}: drop the staged version, never activated;
                                       409 when nothing is staged (deploy)
    POST /episode                      {"instruction", "max_ticks"}: run the active policy on
                                       the device's robot; success and latency figures (operate)
    WS   /policy                       the policy server: observations in, action chunks out
                                       (frames: :mod:`deploy_edge.wire`; the robot's client:
                                       :mod:`deploy_edge.policy_client`; every frame answered,
                                       a stalled client closed within stalled_client_s:
                                       :mod:`deploy_edge.agent.policy_server`) (operate)

The answers are the records of :mod:`deploy_edge.wire` (``to_json()``), which the deploy
client reads back. Every body's optional ``origin`` (:class:`~deploy_edge.wire.Origin`: who
asks, a fleet rollout's id and flow run) is kept on the deployment in the history. The
deployment itself (verify, extract, engine, parity, gate, activate, health, commit, and
rollback on any failure) is :class:`deploy_edge.agent.deployer.Deployer`'s.
A watcher thread activates a staged version once the robot-busy lock file is gone.

The policy server runs each inference in a worker thread (``asyncio.to_thread``), off the event
loop: several robots are served at once and one's inference never holds up another's (ONNX
Runtime's ``run`` is thread-safe; the engine is opened once per active version,
:meth:`~deploy_edge.agent.deployer.Deployer.serving_policy`). A client's frames are answered in
order, one at a time.

Fault injection: with ``ROBO_PIPE_POLICY_DELAY_MS=<ms>`` in the environment every policy-server
inference sleeps that long in its worker thread before the engine runs (a slow engine at the
engine seam, for tests of concurrency and of the robot's loop; never set on a device).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

from fastapi import (
    Depends,
    FastAPI,
    Header,
    HTTPException,
    Query,
    Request,
    WebSocket,
)
from fastapi.responses import PlainTextResponse

from deploy_edge.agent.config import DeviceConfig, Scope, check_device_files
from deploy_edge.agent.deployer import Deployer
from deploy_edge.agent.pieces import PieceStore
from deploy_edge.agent.policy_server import MAX_FRAME_MB, PolicySocketProtocol, serve_frames
from deploy_edge.agent.requests import (
    ActionRequest,
    AssembleRequest,
    DeployRequest,
    EpisodeRequest,
    PiecesRequest,
    RollbackRequest,
    authorize,
    demand,
    log,  # the agent's log: refusals, start-up warnings
    origin_of,
    refused,
)
from deploy_edge.agent.uploads import MIB, UploadRefused, UploadStore
from deploy_edge.wire import Health
from robo_pipe.errors import RoboPipeError

UPLOADS_DIR = "uploads"
PIECES_DIR = "pieces"
LOCK_POLL_S = 1.0
GRACE_S = 5
"""On SIGTERM, open connections get this long to finish before the agent exits."""


def create_app(config: DeviceConfig, deployer: Deployer) -> FastAPI:
    """The agent's FastAPI app over ``deployer`` (see the module docstring)."""
    app = FastAPI(title=f"robo-pipe edge agent {config.name}", docs_url=None, redoc_url=None)
    store = UploadStore(
        config.state_dir / UPLOADS_DIR,
        max_bytes=int(config.max_release_mb * MIB),
        margin_bytes=int(config.free_space_margin_mb * MIB),
        max_age_s=config.upload_max_age_h * 3600.0,
    )
    pieces = PieceStore(
        config.state_dir / PIECES_DIR,
        lambda: [Path(p) for p in deployer.slots.links().values() if p is not None],
        store,
        max_age_s=config.upload_max_age_h * 3600.0,
    )
    for sha256 in store.expired_at_start:
        log.info("deleted partial upload %s: older than upload_max_age_h", sha256[:12])
    busy = threading.Lock()  # one deployment at a time; the deployer serialises the rest

    def require(scope: Scope) -> Any:
        """A FastAPI dependency (``dependencies=[require("read")]``, or a parameter
        ``granted: Scope = require("deploy")`` for the caller's scope): refuses a call
        without a bearer token of at least ``scope`` (401/403, logged; :func:`authorize`)."""

        def dependency(request: Request, authorization: str = Header(default="")) -> Scope:
            return authorize(config, authorization, scope, f"{request.method} {request.url.path}")

        return Depends(dependency)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return Health(ok=True, device=config.name).to_json()

    @app.get("/uploads", dependencies=[require("read")])
    def uploads() -> list[dict[str, Any]]:
        return [u.to_json() for u in store.uploads()]

    @app.get("/uploads/{sha256}", dependencies=[require("read")])
    def received(sha256: str) -> dict[str, Any]:
        try:
            return store.upload(sha256).to_json()
        except UploadRefused as err:
            raise refused(err) from err

    @app.put("/uploads/{sha256}", dependencies=[require("deploy")])
    async def upload(
        sha256: str, request: Request, offset: int = Query(ge=0), size: int = Query(ge=1)
    ) -> dict[str, Any]:
        length = request.headers.get("content-length")
        try:
            done = await store.write(
                sha256, offset, size, int(length) if length else None, request.stream()
            )
        except UploadRefused as err:
            raise refused(err) from err
        return done.to_json()

    @app.delete("/uploads/{sha256}", dependencies=[require("deploy")])
    def delete_upload(sha256: str) -> dict[str, Any]:
        try:
            return store.delete(sha256).to_json()
        except UploadRefused as err:
            raise refused(err) from err

    @app.post("/pieces/missing", dependencies=[require("read")])
    async def missing_pieces(body: PiecesRequest) -> dict[str, Any]:
        try:
            return {"missing": await asyncio.to_thread(pieces.missing, body.pieces)}
        except UploadRefused as err:
            raise refused(err) from err

    @app.put("/pieces", dependencies=[require("deploy")])
    async def put_pieces(request: Request) -> dict[str, Any]:
        length = request.headers.get("content-length")
        try:
            kept = await pieces.put(int(length) if length else None, request.stream())
        except UploadRefused as err:
            raise refused(err) from err
        return {"kept": kept}

    @app.post("/uploads/{sha256}/assemble", dependencies=[require("deploy")])
    async def assemble(sha256: str, body: AssembleRequest) -> dict[str, Any]:
        try:
            done = await pieces.assemble(sha256, body.size, body.pieces)
        except UploadRefused as err:
            raise refused(err) from err
        return done.to_json()

    @app.post("/deployments")
    # A default, not Annotated[Scope, require(...)]: with postponed annotations FastAPI reads
    # the annotation as a string it cannot resolve (require is local) and wants a query field.
    def deploy(body: DeployRequest, granted: Scope = require("deploy")) -> dict[str, Any]:  # noqa: B008
        if body.force:  # forcing past a rule (a downgrade, the floor) is an operator's call
            demand(granted, "operate", "POST /deployments with force")
        origin = origin_of(body.origin)  # a malformed one refused before any work
        if not busy.acquire(blocking=False):
            raise HTTPException(409, "a deployment is running")
        try:  # held (not deletable) until the deployment ends
            path = store.hold_for_deployment(body.sha256)
        except UploadRefused as err:
            busy.release()
            raise refused(err) from err

        def run() -> None:
            installed = False
            try:
                done = deployer.deploy(
                    path, force=body.force, systems_test=body.systems_test, origin=origin
                )
                installed = done.state in ("active", "staged")
            finally:
                store.done_with(body.sha256, installed=installed)
                busy.release()

        threading.Thread(target=run, name="deployment", daemon=True).start()
        return {"accepted": body.sha256}

    @app.get("/status", dependencies=[require("read")])
    def status() -> dict[str, Any]:
        return deployer.status().to_json()

    @app.get("/history", dependencies=[require("read")])
    def history() -> list[dict[str, Any]]:
        return [d.to_json() for d in deployer.history()]

    @app.post("/activate", dependencies=[require("deploy")])
    def activate(body: ActionRequest | None = None) -> dict[str, Any]:
        done = deployer.activate_staged(origin_of(body.origin if body else None))
        if done is None:
            raise HTTPException(409, "nothing staged, or the robot-busy lock is set")
        return done.to_json()

    @app.post("/rollback", dependencies=[require("deploy")])
    def rollback(body: RollbackRequest | None = None) -> dict[str, Any]:
        body = body or RollbackRequest()
        try:
            return deployer.rollback(body.release, origin_of(body.origin)).to_json()
        except RoboPipeError as err:
            raise HTTPException(409, str(err)) from err

    @app.post("/unstage", dependencies=[require("deploy")])
    def unstage(body: ActionRequest | None = None) -> dict[str, Any]:
        try:
            return deployer.unstage(origin_of(body.origin if body else None)).to_json()
        except RoboPipeError as err:
            raise HTTPException(409, str(err)) from err

    @app.post("/episode", dependencies=[require("operate")])
    def episode(body: EpisodeRequest) -> dict[str, Any]:
        try:
            return deployer.run_episode(body.instruction, body.max_ticks).to_json()
        except RoboPipeError as err:
            raise HTTPException(409, str(err)) from err

    @app.websocket("/policy")
    async def policy(websocket: WebSocket) -> None:
        try:  # the policy drives the robot: operate
            authorize(config, websocket.headers.get("authorization", ""), "operate", "WS /policy")
        except HTTPException as err:  # refused in the handshake: the socket is never opened
            await websocket.send_denial_response(
                PlainTextResponse(err.detail, status_code=err.status_code)
            )
            return
        await serve_frames(websocket, deployer)

    return app


def watch_lock(config: DeviceConfig, deployer: Deployer, stop: threading.Event) -> None:
    """Activate a staged version once the robot-busy lock file is gone (until ``stop``)."""
    while not stop.wait(LOCK_POLL_S):
        if config.lock_file is None or config.lock_file.exists():
            continue
        if deployer.status().staged is not None:
            deployer.activate_staged()


def serve(config: DeviceConfig) -> None:
    """Check the config's files (:func:`~deploy_edge.agent.config.check_device_files`:
    :class:`~deploy_edge.agent.config.DeviceConfigError` before anything listens), recover
    from an interrupted deployment, then serve until Ctrl-C or SIGTERM. Once the service has
    stopped, the signal takes effect again as this process handles it (Python's default:
    ``KeyboardInterrupt`` for Ctrl-C, the end of the process for SIGTERM), so that the caller
    can exit with the signal's code."""
    import uvicorn

    # The agent's own lines (refusals, start-up warnings) on stderr, beside uvicorn's.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    check_device_files(config)
    if config.plaintext_off_loopback:
        log.warning(
            "serving plain HTTP on %s (allow_plaintext_off_loopback): bearer tokens and camera "
            "images cross the network in clear",
            config.listen,
        )
    deployer = Deployer(config)
    for note in deployer.recover():
        print(f"recovered: {note}", flush=True)
    host, _, port = config.listen.rpartition(":")
    stop = threading.Event()
    watcher = threading.Thread(target=watch_lock, args=(config, deployer, stop), daemon=True)
    watcher.start()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config, deployer),
            host=host or "127.0.0.1",
            port=int(port),
            ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
            ssl_keyfile=str(config.tls_key) if config.tls_key else None,
            log_level="warning",
            # WS /policy: frames up to MAX_FRAME_MB, and a client that stops reading is
            # closed within stalled_client_s (a ping every half, unanswered for the other half).
            ws=PolicySocketProtocol,
            ws_max_size=MAX_FRAME_MB * MIB,
            ws_ping_interval=config.stalled_client_s / 2,
            ws_ping_timeout=config.stalled_client_s / 2,
            timeout_graceful_shutdown=GRACE_S,
        )
    )
    try:
        # Not uvicorn.run(): it swallows the KeyboardInterrupt a signal raises once the
        # server has stopped, and with it which signal it was.
        server.run()
    finally:
        stop.set()
