"""The MLflow model registry: policy versions, aliases, promotion and rollback.

Conventions (aliases, not stages):

- every exported policy the pipeline registers becomes a new version of the registered model
  ``registry.model_name``, aliased ``candidate``;
- registering and moving ``champion`` happen under :func:`promotion_lock`, one per model name,
  shared by every process of this home: so one export is never registered twice by two runs at
  once, and a promotion is a compare-and-set (``pipelines.steps.register.register_version``
  re-reads the champion under the lock and re-compares a candidate that was evaluated against an
  older one: ``pipelines.champion.recheck``);
- ``champion`` moves to it only when every enforced promotion gate passed (the rules are
  :mod:`stages.register`); the registered model's tag ``robo_pipe.champion_history`` lists the
  champions in order, so ``rollback`` can restore the previous one;
- a version's tags carry what its export's I/O spec says of it (:func:`spec_tags`): its
  parameter count and export cost, each precision variant's figures
  (``robo_pipe.variant.<name>.*``), and ``robo_pipe.random_weights`` for a policy built with
  random weights (a systems test): such a version is never champion, and :func:`promote`
  refuses it whatever the gates and ``--force`` say;
- a version's directory is an MLflow ``onnx`` flavor model (``model.onnx``, ``MLmodel`` with
  the signature: every input and output's name, dtype and shape) that is also a robo-pipe
  export bundle (:mod:`deploy_edge.bundle`), its I/O spec pointing at ``model.onnx``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from deploy_edge.bundle import (
    IO_SPEC_FILE,
    IOSpec,
    TensorSpec,
    copy_bundle,
    read_io_spec,
    verify_bundle,
)
from pipelines.home import home_dir
from pipelines.tracking import TAG, TrackedRun, client
from robo_pipe.errors import RoboPipeError
from stages.register import Gate, gates_from_tags, history_after_promotion, rollback_target

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.models import ModelSignature

MLFLOW_MODEL_FILE = "model.onnx"
"""The model's name in a registered version (MLflow's ``onnx`` flavor writes it)."""
CANDIDATE = "candidate"
CHAMPION = "champion"
HISTORY_TAG = TAG + "champion_history"
PROMOTED_OVER = "promoted_over"
"""Version tag (after ``robo_pipe.``): the champion a promotion replaced (empty: none)."""
PROMOTED_ON = "promoted_on"
"""Version tag: JSON, gate -> ``"passed: <measured>"`` as they stood when it was promoted."""
RANDOM_WEIGHTS_TAG = TAG + "random_weights"
"""Version tag ``true`` on a policy built with random weights (the spec's ``random_weights``)."""
VARIANT_TAG = TAG + "variant."
"""Version tags ``robo_pipe.variant.<name>.<figure>``: each precision variant in the export
(:func:`spec_tags`)."""
WEIGHTS_TAG = TAG + "weights."
"""Version tags ``robo_pipe.weights.<role>.<field>`` (role ``vision``/``text``; field
``package``, ``version``, ``sha256``, ``licence``): where each pretrained encoder's weights
came from (:func:`spec_tags`)."""
RANDOM_WEIGHTS_NOTE = (
    "**Random weights: a systems test only.** This policy was built from a preset's "
    "architecture with random weights (`policy.weights: random`): it is never champion, and an "
    "edge agent runs it only from `robo-pipe deploy --systems-test`."
)
"""The first line of a random-weight version's description (the MLflow UI shows it)."""
MODEL_DIR = "policy"
"""Artifact path of the registered model inside the pipeline's MLflow run."""
PIP_REQUIREMENTS = ["onnxruntime", "tokenizers", "numpy"]
"""What running a registered policy needs (explicit: MLflow's inference of them is slow)."""


class RegistryError(RoboPipeError, ValueError):
    """A registered model, version or alias does not exist, or an operation is not allowed."""


class RandomWeightsError(RegistryError):
    """A version built with random weights (a systems test) cannot become champion."""


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


def _check_model(name: str) -> dict[str, str]:
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
    aliases = _check_model(name)
    found = client().search_model_versions(f"name='{name}'")
    infos = (_info(mv, [a for a, v in aliases.items() if v == str(mv.version)]) for mv in found)
    return sorted(infos, key=lambda v: -int(v.version))


def get_version(name: str, ref: str) -> VersionInfo:
    """Version ``ref`` of ``name``: a number or an alias (``champion``, ``candidate``)."""
    from mlflow.exceptions import MlflowException

    _check_model(name)
    try:
        if ref.isdigit():
            return _info(client().get_model_version(name, ref))
        return _info(client().get_model_version_by_alias(name, ref))
    except MlflowException:
        known = ", ".join(f"{v.version} {v.aliases}" for v in versions(name)) or "none"
        raise RegistryError(f"{name} has no version or alias {ref!r}; versions: {known}") from None


@contextmanager
def promotion_lock(name: str) -> Iterator[None]:
    """Hold the registry lock of model ``name`` (an inter-process lock under the home; re-entrant
    in this thread): registering versions and moving ``champion`` happen under it. With a
    shared MLflow server it serialises the runs of this home, not other machines'."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    path = home_dir("mlflow") / f".promotion-{digest}.lock"
    with FileLock(path, is_singleton=True):
        yield


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


def register_export(
    export_dir: Path,
    name: str,
    run: TrackedRun,
    tags: dict[str, str],
    description: str = "",
) -> VersionInfo:
    """Register the export at ``export_dir`` as a new version of ``name`` (created if missing),
    logged under ``run``'s artifacts, with ``tags`` and the tags its I/O spec gives
    (:func:`spec_tags`, which win: they are what the bundle says); alias it ``candidate``. A
    random-weight policy's version description starts with :data:`RANDOM_WEIGHTS_NOTE`. The
    export is verified against its checksums first, and the registered copy gets its own."""
    import mlflow.onnx
    import onnx
    from mlflow.exceptions import MlflowException

    mlflow_client = client()
    staging = home_dir("exports") / f".register-{run.run_id}"
    shutil.rmtree(staging, ignore_errors=True)
    spec = read_io_spec(export_dir)
    verified = verify_bundle(export_dir)  # before anything is read from it
    tags = {**tags, **spec_tags(spec)}
    model = onnx.load(str(export_dir / spec.onnx_file))  # with its external data
    mlflow.onnx.save_model(
        model,
        str(staging),
        signature=model_signature(spec),
        pip_requirements=PIP_REQUIREMENTS,
        save_as_external_data=model.ByteSize() > 1_500_000_000,  # protobuf's 2 GB limit
        metadata={"robo_pipe_io_spec": IO_SPEC_FILE, **tags},
    )
    # The rest of the bundle, and checksums that hash the model as MLflow wrote it.
    copy_bundle(export_dir, staging, model_file=MLFLOW_MODEL_FILE, verified=verified)
    run.log_artifact(staging, MODEL_DIR)
    shutil.rmtree(staging)
    try:
        mlflow_client.get_registered_model(name)
    except MlflowException:
        mlflow_client.create_registered_model(
            name, description=description or "robo-pipe policy (ONNX, see io_spec.json)"
        )
    mv = mlflow_client.create_model_version(
        name,
        source=run.artifact_uri(MODEL_DIR),
        run_id=run.run_id,
        tags=tags,
        description=RANDOM_WEIGHTS_NOTE if spec.random_weights else None,
    )
    mlflow_client.set_registered_model_alias(name, CANDIDATE, str(mv.version))
    return get_version(name, str(mv.version))


def spec_tags(spec: IOSpec) -> dict[str, str]:
    """The version tags an export's I/O spec gives: ``random_weights`` (only when true),
    ``parameters``, ``export_seconds`` and ``export_peak_rss_mb`` (when recorded), and per
    precision variant ``variant.<name>.precision``, ``.relative_error``, ``.action_error``,
    ``.candidate`` (``true``/``false``), ``.reason`` (when it is not one), and where success
    was measured ``.success_rate``, ``.fp32_success_rate`` and ``.p_value``, and per pretrained
    encoder the policy is built on ``weights.<role>.package``, ``.version``, ``.sha256`` and
    ``.licence`` (where its weights came from, under which licence; all after the
    ``robo_pipe.`` prefix)."""
    tags: dict[str, str] = {}
    if spec.random_weights:
        tags[RANDOM_WEIGHTS_TAG] = "true"
    recorded = {
        "parameters": str(spec.parameters),
        "export_seconds": f"{spec.export_seconds:.1f}",
        "export_peak_rss_mb": f"{spec.export_peak_rss_mb:.0f}",
    }
    for key, value in recorded.items():
        if getattr(spec, key):  # 0: not recorded (an older bundle)
            tags[TAG + key] = value
    for variant in spec.variants:
        figures = {
            "precision": variant.precision,
            "relative_error": f"{variant.relative_error:.4g}",
            "action_error": f"{variant.action_error:.4g}",
            "candidate": "true" if variant.candidate else "false",
        }
        if variant.reason:
            figures["reason"] = variant.reason
        for key, tag in (
            ("rate", "success_rate"),
            ("fp32_rate", "fp32_success_rate"),
            ("p_value", "p_value"),
        ):
            if key in variant.success:
                figures[tag] = f"{variant.success[key]:.4g}"
        for figure, value in figures.items():
            tags[f"{VARIANT_TAG}{variant.name}.{figure}"] = value[:TAG_VALUE_LIMIT]
    for source in spec.weights_sources:
        provenance = {
            "package": source.package,
            "version": source.version,
            "sha256": source.sha256,
            "licence": source.licence,
        }
        for key, value in provenance.items():
            if value:  # "": not from a package (a local file has no package nor version)
                tags[f"{WEIGHTS_TAG}{source.role}.{key}"] = value[:TAG_VALUE_LIMIT]
    return tags


TAG_VALUE_LIMIT = 5000
"""Characters MLflow keeps in a model version tag's value (a long ``reason`` is cut)."""


def is_random_weights(tags: dict[str, str]) -> bool:
    """Whether a version with these tags holds a policy built with random weights."""
    return tags.get(RANDOM_WEIGHTS_TAG) == "true"


def model_signature(spec: IOSpec) -> ModelSignature:
    """The MLflow signature of an export, from its I/O spec: every input and output by name,
    dtype and shape, the batch axis as -1 (any size)."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema
    from mlflow.types.schema import TensorSpec as MlflowTensor

    def schema(tensors: tuple[TensorSpec, ...]) -> Schema:
        return Schema([MlflowTensor(np.dtype(t.dtype), t.dims(-1), t.name) for t in tensors])

    return ModelSignature(inputs=schema(spec.inputs), outputs=schema(spec.outputs))


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
        if info.tags.get(TAG + "onnx_hash") == onnx_hash:
            return info
    return None


def champion_to_beat(name: str, onnx_hash: str) -> VersionInfo | None:
    """The champion a new export (``onnx_hash``) is compared with: None if there is none, or if
    it is this very export (nothing to compare with)."""
    current = champion(name)
    if current and current.tags.get(TAG + "onnx_hash") == onnx_hash:
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
            TAG + "promoted_at": stamp,
            TAG + "promoted_by": reason,
            TAG + PROMOTED_OVER: previous.version if previous else "",
            TAG + PROMOTED_ON: json.dumps(gates),
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
        _check_model(name)
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
    set_version_tags(name, current.version, {TAG + "rolled_back_at": stamp})
    return get_version(name, previous)


def fetch_export(name: str, ref: str) -> tuple[VersionInfo, Path]:
    """Download version ``ref`` (number or alias) of ``name`` into
    ``$ROBO_PIPE_HOME/exports/registry/<name>/<version>`` (once) and return it with the
    directory, which the edge runtime and evaluation load like any export (verifying it when
    they open it). A download that does not verify is refused, not kept."""
    import mlflow.artifacts

    info = get_version(name, ref)
    target = home_dir("exports") / "registry" / name / info.version
    if (target / IO_SPEC_FILE).is_file():
        return info, target
    staging = target.with_name(f".{info.version}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    mlflow.artifacts.download_artifacts(f"models:/{name}/{info.version}", dst_path=str(staging))
    verify_bundle(staging)  # a registry copy that is not a bundle, or differs, is not kept
    staging.rename(target)
    return info, target
