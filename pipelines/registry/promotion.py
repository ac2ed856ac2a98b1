"""Promotion and rollback: the ``champion`` alias and the champion history move together.

Registering versions and moving ``champion`` happen under :func:`promotion_lock`, one per model
name, shared by every process of this home: so one export is never registered twice by two
runs at once, and a promotion is a compare-and-set (``pipelines.steps.register.register_version``
re-reads the champion under the lock and re-compares a candidate that was evaluated against an
older one: :func:`pipelines.registry.champion.recheck`). ``champion`` moves to a version only
when every enforced promotion gate passed (the rules are :mod:`stages.register`); the
registered model's tag :data:`~pipelines.registry.tags.HISTORY_TAG` lists the champions in
order, so :func:`rollback` can restore the previous one. A policy built with random weights (a
systems test) is never champion: :func:`promote` refuses it whatever the gates and ``--force``
say.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

from filelock import FileLock

from pipelines.home import home_dir
from pipelines.registry.tags import (
    HISTORY_TAG,
    PROMOTED_AT_TAG,
    PROMOTED_BY_TAG,
    PROMOTED_ON_TAG,
    PROMOTED_OVER_TAG,
    RANDOM_WEIGHTS_TAG,
    ROLLED_BACK_AT_TAG,
)
from pipelines.registry.versions import (
    CHAMPION,
    RegistryError,
    VersionInfo,
    champion,
    check_model,
    get_version,
    set_version_tags,
)
from pipelines.tracking import client
from stages.register import history_after_promotion, rollback_target


class RandomWeightsError(RegistryError):
    """A version built with random weights (a systems test) cannot become champion."""


@contextmanager
def promotion_lock(name: str) -> Iterator[None]:
    """Hold the registry lock of model ``name`` (an inter-process lock under the home; re-entrant
    in this thread): registering versions and moving ``champion`` happen under it. With a
    shared MLflow server it serialises the runs of this home, not other machines'."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    path = home_dir("mlflow") / f".promotion-{digest}.lock"
    with FileLock(path, is_singleton=True):
        yield


def champion_history(name: str) -> list[str]:
    """Versions that were champion of ``name``, oldest first."""
    tags = client().get_registered_model(name).tags or {}
    history: list[str] = json.loads(tags.get(HISTORY_TAG, "[]"))
    return history


def promote(name: str, version: str, reason: str) -> VersionInfo:
    """Make ``version`` the champion of ``name`` and record it in the champion history (under
    :func:`promotion_lock`: the alias and the history move together). The version keeps a
    record of this promotion that later re-registrations of its export do not touch: the
    champion it replaced (``promoted_over``, empty for the first) and the gates it had passed
    (``promoted_on``: gate -> ``passed``/``failed`` and what was measured).

    Refuses (:class:`RandomWeightsError`) a version built with random weights, whoever asks
    and whatever its gates say: forcing past gates is for a judgement about a real policy,
    and a random one has none to judge."""
    with promotion_lock(name):
        info = get_version(name, version)
        check_promotable(info)
        previous = champion(name)
        mlflow_client = client()
        mlflow_client.set_registered_model_alias(name, CHAMPION, info.version)
        history = history_after_promotion(champion_history(name), info.version)
        mlflow_client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        gates = {
            gate: f"{'passed' if g.passed else 'failed'}: {g.measured}"
            for gate, g in info.gates.items()
        }
        tags = {
            PROMOTED_AT_TAG: stamp,
            PROMOTED_BY_TAG: reason,
            PROMOTED_OVER_TAG: previous.version if previous else "",
            PROMOTED_ON_TAG: json.dumps(gates),
        }
        set_version_tags(name, info.version, tags)
        return get_version(name, info.version)


def check_promotable(info: VersionInfo) -> None:
    """Raise :class:`RandomWeightsError` (one line, saying why) if ``info`` may never be
    champion: its policy was built with random weights."""
    if info.random_weights:
        raise RandomWeightsError(
            f"{info.name} v{info.version} has random weights ({RANDOM_WEIGHTS_TAG} = true: "
            "policy.weights: random, a systems test): never champion, not even with --force"
        )


def rollback(name: str) -> VersionInfo:
    """Give ``champion`` back to the previous champion of ``name``."""
    with promotion_lock(name):
        return _rollback(name)


def _rollback(name: str) -> VersionInfo:
    current = champion(name)
    history = champion_history(name)
    if current is None:
        check_model(name)
        raise RegistryError(f"{name} has no champion to roll back")
    target = rollback_target(history, current.version)
    if target is None:
        raise RegistryError(
            f"{name}: version {current.version} is the only champion there has been; "
            "nothing to roll back to"
        )
    previous, earlier = target
    client().set_registered_model_alias(name, CHAMPION, previous)
    client().set_registered_model_tag(name, HISTORY_TAG, json.dumps(earlier))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    set_version_tags(name, current.version, {ROLLED_BACK_AT_TAG: stamp})
    return get_version(name, previous)
