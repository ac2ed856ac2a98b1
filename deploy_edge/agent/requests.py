"""The edge agent's request bodies, its bearer-token check, and how an upload refusal answers
(:mod:`deploy_edge.agent.service`'s endpoints are thin layers over these)."""

from __future__ import annotations

import hashlib
import logging
from typing import Any, NoReturn

from fastapi import HTTPException
from pydantic import BaseModel, Field

from deploy_edge.agent.config import DeviceConfig, Scope, allows
from deploy_edge.agent.uploads import Reason, UploadRefused
from deploy_edge.wire import Origin
from robo_pipe.records import RecordError

log = logging.getLogger("deploy_edge.agent")
"""The agent's log (the service's): refused calls, the endpoint and the scope they lacked."""


class DeployRequest(BaseModel):
    """Body of ``POST /deployments``."""

    sha256: str
    force: bool = False
    systems_test: bool = False
    """The deploy says it is a systems test: a random-weights release may go live (recorded)."""
    origin: dict[str, Any] | None = None
    """Who asks (:class:`~deploy_edge.wire.Origin`'s fields), recorded on the deployment."""


class PiecesRequest(BaseModel):
    """Body of ``POST /pieces/missing``."""

    pieces: list[str]


class AssembleRequest(BaseModel):
    """Body of ``POST /uploads/{sha256}/assemble``: the release's size and its pieces in order."""

    size: int = Field(ge=1)
    pieces: list[tuple[str, int]]


class ActionRequest(BaseModel):
    """Body of ``POST /activate``, ``POST /unstage`` (optional: an older client sends none)."""

    origin: dict[str, Any] | None = None
    """Who asks (:class:`~deploy_edge.wire.Origin`'s fields), recorded on the deployment."""


class RollbackRequest(ActionRequest):
    """Body of ``POST /rollback`` (optional)."""

    release: int | None = None
    """Roll back only if the previous version is this release (None: whatever it is)."""


class EpisodeRequest(BaseModel):
    """Body of ``POST /episode``."""

    instruction: str | None = None
    """None: the task the robot's scene poses (the simulated arm's), else the config's."""
    max_ticks: int = 100


def authorize(config: DeviceConfig, authorization: str, needed: Scope, endpoint: str) -> Scope:
    """The scope of the bearer token in ``authorization`` (an ``Authorization`` header), if it
    allows ``needed``; else :class:`HTTPException` 401 (no token, not the ``Bearer`` scheme, an
    unknown token) or 403 (a token of a lower scope; :func:`demand`)."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme != "Bearer" or not token.strip():
        _refuse(401, endpoint, needed, "expected 'Authorization: Bearer <token>'")
    granted = config.tokens.scope_of(_token_sha256(token.strip()))
    if granted is None:
        _refuse(401, endpoint, needed, "unknown bearer token")
    demand(granted, needed, endpoint)
    return granted


def demand(granted: Scope, needed: Scope, endpoint: str) -> None:
    """Refuse (403) a caller whose token's scope ``granted`` does not allow ``needed``."""
    if not allows(granted, needed):
        _refuse(403, endpoint, needed, f"the token's scope is {granted!r}")


def _refuse(status: int, endpoint: str, needed: Scope, why: str) -> NoReturn:
    """Log the refusal (the endpoint and the scope it lacked, never the token or its hash) and
    answer it, naming the scope needed."""
    log.warning("refused %s: %s; it needs scope %r", endpoint, why, needed)
    raise HTTPException(status, f"{endpoint} needs a token of scope {needed!r}: {why}")


def origin_of(data: dict[str, Any] | None) -> Origin | None:
    """A request's ``origin`` as the record (422 naming the field when it does not fit)."""
    if data is None:
        return None
    try:
        return Origin.from_json(data)
    except RecordError as err:
        raise HTTPException(422, f"origin: {err}") from err


def _token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


UPLOAD_STATUS: dict[Reason, int] = {
    "not-a-sha256": 400,
    "too-large": 413,
    "no-space": 413,
    "past-size": 413,
    "size-differs": 409,
    "offset": 409,
    "busy": 409,
    "hash-mismatch": 422,
    "not-uploaded": 404,
    "incomplete": 409,
    "missing-pieces": 409,
    "bad-batch": 400,
}
"""The HTTP status of each upload refusal."""


def refused(err: UploadRefused) -> HTTPException:
    """An upload refusal as the agent answers it: the detail carries the reason, the message
    and the upload's ``received`` and ``size`` (a client resumes or starts over from them)."""
    detail = {
        "reason": err.reason,
        "message": str(err),
        "received": err.received,
        "size": err.size,
    }
    return HTTPException(UPLOAD_STATUS[err.reason], detail)
