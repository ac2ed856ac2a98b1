"""The registered models' versions and aliases: resolve, list, tag, describe.

Conventions (aliases, not stages): every exported policy the pipeline registers becomes a new
version of the registered model ``registry.model_name`` (:mod:`pipelines.registry.exports`),
aliased ``candidate``; ``champion`` moves to it only when every enforced promotion gate passed
(:mod:`pipelines.registry.promotion`). A version is written ``models:/NAME@ALIAS`` or
``models:/NAME/VERSION`` (:func:`parse_model_uri`) everywhere a command takes one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pipelines.registry.tags import ONNX_HASH_TAG, is_random_weights
from pipelines.tracking import client
from robo_pipe.errors import RoboPipeError
from stages.register import Gate, gates_from_tags

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

CANDIDATE = "candidate"
CHAMPION = "champion"
RANDOM_WEIGHTS_NOTE = (
    "**Random weights: a systems test only.** This policy was built from a preset's "
    "architecture with random weights (`policy.weights: random`): it is never champion, and an "
    "edge agent runs it only from `robo-pipe deploy --systems-test`."
)
"""The first line of a random-weight version's description (the MLflow UI shows it)."""


class RegistryError(RoboPipeError, ValueError):
    """A registered model, version or alias does not exist, or an operation is not allowed."""


@dataclass
class VersionInfo:
    """A registered model version as robo-pipe shows it."""

    name: str
    version: str
    aliases: list[str]
    run_id: str
    source: str
    created: str
    """UTC time of registration."""
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def gates(self) -> dict[str, Gate]:
        """The promotion gates recorded on this version when it was registered."""
        return gates_from_tags(self.tags)

    @property
    def random_weights(self) -> bool:
        """Whether the version's policy was built with random weights (a systems test)."""
        return is_random_weights(self.tags)

    @property
    def uri(self) -> str:
        """``models:/<name>/<version>``."""
        return f"models:/{self.name}/{self.version}"

    def to_json(self) -> dict[str, Any]:
        """Plain-dict form for JSON output."""
        return {**asdict(self), "uri": self.uri}


def _info(mv: ModelVersion, aliases: list[str] | None = None) -> VersionInfo:
    """``mv`` as a record; ``aliases`` (default: the version's own) where the caller read them
    from the registered model (a search of versions returns none on the SQL store)."""
    created = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(int(mv.creation_timestamp) / 1000))
    return VersionInfo(
        name=mv.name,
        version=str(mv.version),
        aliases=sorted(mv.aliases or []) if aliases is None else sorted(aliases),
        run_id=str(mv.run_id or ""),
        source=str(mv.source),
        created=created,
        tags=dict(mv.tags or {}),
    )


def model_names() -> list[str]:
    """Every registered model's name."""
    return sorted(m.name for m in client().search_registered_models(max_results=1000))


def check_model(name: str) -> dict[str, str]:
    """Raise :class:`RegistryError` naming the registered models unless ``name`` is one; its
    aliases (alias -> version number) otherwise."""
    from mlflow.exceptions import MlflowException

    try:
        aliases = client().get_registered_model(name).aliases or {}
    except MlflowException:
        names = model_names()
        known = ", ".join(names) if names else "none yet (robo-pipe run registers one)"
        raise RegistryError(f"no registered model {name!r}; registered models: {known}") from None
    return {str(alias): str(version) for alias, version in aliases.items()}


def versions(name: str) -> list[VersionInfo]:
    """Every version of ``name``, newest first, each with its aliases.

    MLflow's version search returns no aliases on the SQL store (mlflow#9783), so they are read
    from the registered model, which has them on every store."""
    aliases = check_model(name)
    found = client().search_model_versions(f"name='{name}'")
    infos = (_info(mv, [a for a, v in aliases.items() if v == str(mv.version)]) for mv in found)
    return sorted(infos, key=lambda v: -int(v.version))


def get_version(name: str, ref: str) -> VersionInfo:
    """Version ``ref`` of ``name``: a number or an alias (``champion``, ``candidate``)."""
    from mlflow.exceptions import MlflowException

    check_model(name)
    try:
        if ref.isdigit():
            return _info(client().get_model_version(name, ref))
        return _info(client().get_model_version_by_alias(name, ref))
    except MlflowException:
        known = ", ".join(f"{v.version} {v.aliases}" for v in versions(name)) or "none"
        raise RegistryError(f"{name} has no version or alias {ref!r}; versions: {known}") from None


def champion(name: str) -> VersionInfo | None:
    """The current champion of ``name``, or None (no such model, or no champion yet)."""
    try:
        return get_version(name, CHAMPION)
    except RegistryError:
        return None


MODEL_URI_FORMS = "models:/NAME@ALIAS or models:/NAME/VERSION (or NAME@ALIAS, NAME/VERSION)"
"""How a model version is written, everywhere a command takes one."""


def parse_model_uri(uri: str) -> tuple[str, str]:
    """A model version -> (name, version number or alias): ``models:/NAME@ALIAS`` or
    ``models:/NAME/VERSION``, or the shorthands ``NAME@ALIAS`` and ``NAME/VERSION``.

    Raises :class:`RegistryError` naming the accepted forms for anything else (a bare name,
    ``NAME/`` with no number, an empty alias)."""
    name, which = parse_model_ref(uri)
    if which is None:
        raise RegistryError(f"{uri!r} names a registered model, not a version: {MODEL_URI_FORMS}")
    return name, which


def parse_model_name(text: str) -> str:
    """A registered model -> its name: ``models:/NAME`` or ``NAME``."""
    name, which = parse_model_ref(text)
    if which is not None:
        raise RegistryError(f"{text!r} names a version; a registered model is models:/NAME or NAME")
    return name


def parse_model_ref(text: str) -> tuple[str, str | None]:
    """A registered model or one of its versions -> (name, version or alias, None for the
    model): the one parser of every form above."""
    ref = text.removeprefix("models:/")
    if "@" in ref:
        name, _, which = ref.partition("@")
    elif "/" in ref:
        name, _, which = ref.rpartition("/")
        if not which.isdigit():
            which = ""  # NAME/ALIAS is not a form: an alias follows @
    else:
        name, which = ref, None
    if not name or which == "" or "/" in name or ":" in name:
        raise RegistryError(f"{text!r}: expected {MODEL_URI_FORMS}, or models:/NAME for a model")
    return name, which


def set_version_description(name: str, version: str, description: str) -> None:
    """Set the description (markdown) the MLflow UI shows on a model version's page; a
    random-weight version's starts with :data:`RANDOM_WEIGHTS_NOTE` whatever it is given."""
    if (
        is_random_weights(get_version(name, version).tags)
        and RANDOM_WEIGHTS_NOTE not in description
    ):
        description = f"{RANDOM_WEIGHTS_NOTE}\n\n{description}"
    client().update_model_version(name, version, description=description)


def find_export(name: str, onnx_hash: str) -> VersionInfo | None:
    """The version of ``name`` registered from the export with ``onnx_hash``, if any."""
    if name not in model_names():
        return None
    for info in versions(name):
        if info.tags.get(ONNX_HASH_TAG) == onnx_hash:
            return info
    return None


def champion_to_beat(name: str, onnx_hash: str) -> VersionInfo | None:
    """The champion a new export (``onnx_hash``) is compared with: None if there is none, or if
    it is this very export (nothing to compare with)."""
    current = champion(name)
    if current and current.tags.get(ONNX_HASH_TAG) == onnx_hash:
        return None
    return current


def set_alias(name: str, alias: str, version: str) -> VersionInfo:
    """Point ``alias`` of ``name`` at ``version``."""
    client().set_registered_model_alias(name, alias, version)
    return get_version(name, version)


def set_version_tags(name: str, version: str, tags: dict[str, Any]) -> None:
    """Tag a model version (values as strings)."""
    mlflow_client = client()
    for key, value in tags.items():
        mlflow_client.set_model_version_tag(name, version, key, str(value))
