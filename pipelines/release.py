"""The deploy steps: a registry version as a signed release, and that release on a device.

    bundle_release(model_uri, key) -> (Manifest, release file)   (reused while valid)
    deploy_release(device, release) -> Deployment                (upload, then the agent's steps)

Like :mod:`pipelines.steps`, the CLI verbs call these and report progress to a
:class:`~pipelines.progress.Listener`; the device does the verifying, building, gating and
activating itself (:mod:`deploy_edge.agent`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import registry
from pipelines.home import home_dir
from pipelines.progress import SILENT, Listener, status_lines

if TYPE_CHECKING:
    from deploy_edge.agent.deployer import Deployment
    from deploy_edge.client import DeviceEntry
    from deploy_edge.release import Manifest
    from pipelines.config import PipelineConfig
    from pipelines.records import EdgeDeployment, Registration

DEPLOY_STEPS = ("upload", "verify", "extract", "engine", "parity", "gate", "activate", "health")
"""What ``robo-pipe deploy`` shows, in order (the agent's steps after the upload)."""


def default_key() -> Path:
    """The signing key ``robo-pipe keys generate`` writes by default."""
    return home_dir("keys") / "robo-pipe.key"


def bundle_release(
    model_uri: str,
    key: Path,
    out: Path | None = None,
    expires_in_days: float | None = 30.0,
    targets: Sequence[str] = (),
    budget_ms: float | None = None,
) -> tuple[Manifest, Path]:
    """The registry version ``model_uri`` (``models:/name@alias`` or ``name/3``) as a release
    signed with ``key``: its export bundle with a manifest (model, version, run, every file's
    sha256, the I/O spec, ``targets``, ``budget_ms``, expiry) and the release number for
    anti-rollback, which is the registry version number (a newer version is a newer release).
    An earlier release of the same version with the same key is reused while it verifies and
    has not expired; a new one is signed only over a bundle that verifies against its checksums
    (:func:`deploy_edge.bundle.verify_bundle`)."""
    from deploy_edge.bundle import verify_bundle
    from deploy_edge.keys import key_id, load_private_key
    from deploy_edge.release import (
        ReleaseError,
        check_policy,
        verify_release,
        write_release,
    )

    private = load_private_key(key)
    name, ref = registry.parse_model_uri(model_uri)
    info, export_dir = registry.fetch_export(name, ref)
    signer = key_id(private.public_key())
    target = out or home_dir("releases") / f"{name}-v{info.version}-{signer}.release"
    if target.is_file():
        try:
            manifest = verify_release(target, [private.public_key()])
            check_policy(manifest, active_release=None)
            if (manifest.targets, manifest.budget_ms) == (list(targets), budget_ms):
                return manifest, target
        except ReleaseError:
            pass  # expired or not ours: sign it again
    verify_bundle(export_dir)  # never sign a registry copy that changed since it was fetched
    manifest = write_release(
        export_dir,
        target,
        private,
        model_name=name,
        model_version=info.version,
        run_id=info.run_id,
        release=int(info.version),
        targets=targets,
        budget_ms=budget_ms,
        expires_in_days=expires_in_days,
    )
    return manifest, target


def deploy_release(
    device: DeviceEntry,
    release: Path,
    force: bool = False,
    listener: Listener = SILENT,
    timeout_s: float = 1800.0,
) -> Deployment:
    """Upload ``release`` to ``device``'s agent (resuming a cut upload) and follow the agent's
    steps to the end, all within ``timeout_s``. The agent's record of the deployment:
    ``state`` is ``active`` only when the device now runs the new version."""
    from deploy_edge.agent.deployer import Deployment
    from deploy_edge.client import AgentClient
    from deploy_edge.release import file_sha256

    sha256, size = file_sha256(release), release.stat().st_size
    shown: set[str] = set()

    def on_upload(sent: int, total: int) -> None:
        listener.advanced("upload", sent, f"{sent / 1e6:.1f} / {total / 1e6:.1f} MB")

    def show(steps: list[dict[str, Any]]) -> None:  # each agent step once, as it ends
        for step in steps:
            if step["name"] not in shown:
                shown.add(step["name"])
                verdict = "ok" if step["ok"] else f"FAILED: {step['detail']}"
                listener.finished(step["name"], f"{verdict} ({step['seconds']:.1f} s)", False)

    def on_status(status: dict[str, Any]) -> None:
        running = status.get("running")
        show(running.get("steps", []) if isinstance(running, dict) else [])

    deadline = time.monotonic() + timeout_s
    with AgentClient(device, timeout_s=min(30.0, timeout_s)) as client:
        client.health()
        listener.started("upload", size, "bytes")
        client.upload(release, sha256, on_upload)
        listener.finished("upload", f"{size / 1e6:.1f} MB", reused=False)
        left = max(1.0, deadline - time.monotonic())
        record = client.deploy(sha256, force, on_status, timeout_s=left, poll_s=0.25)
        show(record["steps"])  # the last steps end after the last poll
        return Deployment.from_json(record)


def deploy_to_local_agent(
    cfg: PipelineConfig, registration: Registration, listener: Listener = SILENT
) -> EdgeDeployment:
    """The pipeline's deploy stage: ``registration``'s version, signed with the home's key,
    onto the local edge agent (:mod:`pipelines.local_agent`), then one episode on it. A device
    that already runs this release keeps it (a re-run of the demo changes nothing there)."""
    from deploy_edge.client import AgentClient
    from deploy_edge.release import file_sha256
    from pipelines.local_agent import agent_dir, running_local_agent, signing_key
    from pipelines.records import EdgeDeployment

    uri = f"models:/{registration.name}/{registration.version}"
    _, path = bundle_release(uri, signing_key())
    # Runs sharing the home take turns with the agent: a second deploy waits, and says so.
    with running_local_agent(cfg, status_lines("deploy", listener)) as device:
        with AgentClient(device) as client:
            active = client.status().get("active") or {}
            history = client.history()
        if active.get("sha256") == file_sha256(path):  # already there: report the gate it passed
            went_live = [
                d
                for d in history
                if d["release_sha256"] == active["sha256"] and d["state"] == "active"
            ]
            state, reason = "active", "already runs this release"
            gate = went_live[0].get("gate") if went_live else None
            listener.finished("verify", "already runs this release", reused=True)
        else:
            done = deploy_release(device, path, listener=listener)
            state, reason, gate = done.state, done.reason, done.gate
        episode = None
        if state == "active":
            listener.started("episode", cfg.deploy.episode_ticks, "ticks")
            with AgentClient(device) as client:
                episode = client.episode(None, cfg.deploy.episode_ticks)  # the scene's task
            success = {True: "success", False: "no success", None: "done"}[episode["success"]]
            detail = f"{success} in {episode['ticks']} ticks, p99 {episode['p99_ms']:.2f} ms"
            listener.finished("episode", detail, reused=False)
    return EdgeDeployment(
        device=device.name,
        model_version=registration.version,
        state=state,
        reason=reason,
        p99_ms=gate["p99_ms"] if gate else None,
        episode_success=episode["success"] if episode else None,
        episode_ticks=episode["ticks"] if episode else 0,
        episode_p99_ms=episode["p99_ms"] if episode else None,
        state_dir=str(agent_dir() / "state"),
    )
