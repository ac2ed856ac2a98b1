"""The first two steps of a deployment: a release file in, a slot on the device out.

    verify    signature by a trusted key; not the active version already; for this target;
              a random-weights policy only in a deploy that says it is a systems test; not
              below the release floor, not expired (unless forced)
    extract   into state_dir/slots/<release>-<sha12>, every file hashed against the manifest,
              within the config's size cap; the slot's record written beside it

A refusal raises :class:`~deploy_edge.agent.trials.Refused` (or the release format's
:class:`~deploy_edge.release.ReleaseError`), which the step records and the deployer undoes.
"""

from __future__ import annotations

from deploy_edge.agent.config import DeviceConfig
from deploy_edge.agent.floor import ReleaseFloor
from deploy_edge.agent.journaled_run import JournaledRun
from deploy_edge.agent.slots import SlotStore, remove_path
from deploy_edge.agent.trials import Refused
from deploy_edge.keys import load_public_key
from deploy_edge.release.manifest import Manifest, check_policy
from deploy_edge.release.payload import extract_release
from deploy_edge.release.signature import verify_release
from deploy_edge.targets import TargetProfile
from deploy_edge.wire import Slot


def verify(
    run: JournaledRun,
    config: DeviceConfig,
    profile: TargetProfile,
    slots: SlotStore,
    floor: ReleaseFloor,
    force: bool,
) -> Manifest:
    """The release's manifest once it passes every install rule; ``run``'s record names it."""
    assert run.release_file is not None
    keys = [load_public_key(path) for path in config.trusted_keys]
    manifest = verify_release(run.release_file, keys)
    d = run.deployment
    d.model_name, d.model_version, d.release = (
        manifest.model_name,
        manifest.model_version,
        manifest.release,
    )
    active = slots.slot("active")
    if active is not None and active.sha256 == d.release_sha256:
        raise Refused(f"release {d.release_sha256[:12]} is already the active version")
    if manifest.targets and profile.name not in manifest.targets:
        raise Refused(f"release is for targets {manifest.targets}, this device is {profile.name!r}")
    if manifest.io_spec.random_weights and not d.systems_test:
        raise Refused(
            "random-weights: the policy was built with random weights for systems "
            "measurements only; deploy it only as a systems test (robo-pipe deploy "
            "--systems-test)"
        )
    lowest = floor.of(manifest.model_name)
    d.forced = check_policy(manifest, floor=lowest, force=force)
    past = [f"{r} (floor {lowest})" if r == "downgrade" else r for r in d.forced]
    forced = f"; forced past: {', '.join(past)}" if d.forced else ""
    test = "; a systems test" if d.systems_test else ""
    run.detail = (
        f"{manifest.model_name} {manifest.model_version} release {manifest.release}, "
        f"signed by {manifest.key_id}{forced}{test}"
    )
    return manifest


def extract(run: JournaledRun, manifest: Manifest, slots: SlotStore, max_release_mb: float) -> Slot:
    """The verified release extracted into a new slot (``max_release_mb``: the size cap)."""
    assert run.release_file is not None
    sha = run.deployment.release_sha256
    name = f"{manifest.release}-{sha[:12]}"
    if name in slots.referenced():  # e.g. the previous version, redeployed by force
        name = f"{name}-{run.id[:6]}"
    dest = slots.slots_dir / name
    remove_path(dest)  # a leftover of an interrupted deployment
    cap = int(max_release_mb * (1 << 20))  # MiB -> bytes
    bundle = extract_release(run.release_file, manifest, dest, max_bytes=cap)
    slot = Slot(manifest.model_name, manifest.model_version, manifest.release, str(bundle), sha)
    slot.content_sha256 = manifest.content_sha256
    slot.systems_test = run.deployment.systems_test
    slot.expires_at = manifest.expires_at
    slots.write(name, slot)
    run.slot = slot
    run.detail = f"{len(manifest.files)} files into slots/{name}"
    return slot
