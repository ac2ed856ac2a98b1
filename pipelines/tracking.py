"""MLflow: one run per pipeline run, a nested run per stage, and the model registry.

Runs are addressed by id through one :class:`mlflow.MlflowClient` (no "active run" state), so
stages running in Prefect's worker threads log to the right run. The store is
``MLFLOW_TRACKING_URI`` (see :mod:`pipelines.services`; the embedded default is SQLite).

Registry conventions (aliases, not stages):

- every exported policy the pipeline registers becomes a new version of the registered model
  ``registry.model_name``, aliased ``candidate``;
- ``champion`` moves to it only when every promotion gate passed; the registered model's tag
  ``robo_pipe.champion_history`` lists the champions in order, so ``rollback`` can restore the
  previous one;
- a version's directory is an MLflow ``onnx`` flavor model (``model.onnx``, ``MLmodel`` with
  the signature: every input and output's name, dtype and shape) that is also a robo-pipe
  export directory: ``io_spec.json`` (pointing at ``model.onnx``),
  ``tokenizer/``, ``normalization.json`` and ``reference.npz`` beside it.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.home import home_dir
from pipelines.services import default_artifact_root, default_tracking_uri
from robo_pipe.errors import RoboPipeError

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.models import ModelSignature

TAG = "robo_pipe."
CANDIDATE = "candidate"
CHAMPION = "champion"
HISTORY_TAG = TAG + "champion_history"
GATE_TAG = TAG + "gate."
"""Prefix of a version's gate tags: ``gate.<name>`` = passed|failed, ``gate.<name>.measured``
and ``gate.<name>.required`` (gate names hold no dots)."""
MODEL_DIR = "policy"
"""Artifact path of the registered model inside the pipeline's MLflow run."""
PIP_REQUIREMENTS = ["onnxruntime", "tokenizers", "numpy"]
"""What running a registered policy needs (explicit: MLflow's inference of them is slow)."""


class RegistryError(RoboPipeError, ValueError):
    """A registered model, version or alias does not exist, or an operation is not allowed."""


def client() -> MlflowClient:
    """A client of the configured tracking store and registry."""
    from mlflow import MlflowClient

    return MlflowClient()


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> ``{"a.b.c": "value"}`` (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if not isinstance(value, str) else value
    return flat


# -- runs ----------------------------------------------------------------------------------------


def experiment_id(mlflow_client: MlflowClient, name: str) -> str:
    """The experiment ``name``, created if missing (artifacts under the home on the default
    store, the server's default location otherwise)."""
    import os

    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    on_default_store = os.environ.get("MLFLOW_TRACKING_URI") == default_tracking_uri()
    location = f"{default_artifact_root()}/{name}" if on_default_store else None
    return str(mlflow_client.create_experiment(name, artifact_location=location))


@dataclass
class TrackedRun:
    """One MLflow run, addressed by id (a pipeline run or one of its stages)."""

    run_id: str
    experiment_id: str

    @classmethod
    def start(
        cls,
        experiment: str,
        name: str,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
    ) -> TrackedRun:
        """Create a run in ``experiment``; with ``parent_run_id`` it is nested under it."""
        mlflow_client = client()
        exp = experiment_id(mlflow_client, experiment)
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = mlflow_client.create_run(exp, tags=all_tags, run_name=name)
        return cls(run.info.run_id, exp)

    def log_params(self, params: dict[str, Any]) -> None:
        """Log ``params`` flattened (``a.b.c``), values cut to MLflow's 6000 characters."""
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in flatten(params).items()]
        for start in range(0, len(items), 100):  # MLflow's batch limit
            client().log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Log scalar metrics at ``step``."""
        self.log_curves([{**metrics, "step": step}])

    def log_curves(self, records: list[dict[str, float]], step_key: str = "step") -> None:
        """Log a series: each record's numbers at the record's ``step_key`` value."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(value), now, int(record.get(step_key, 0)))
            for record in records
            for key, value in record.items()
            if key not in (step_key, "time") and isinstance(value, int | float)
        ]
        for start in range(0, len(metrics), 1000):
            client().log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Set run tags (values as strings)."""
        from mlflow.entities import RunTag

        client().log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a directory's contents, to the run's artifacts."""
        p = Path(path)
        if p.is_dir():
            client().log_artifacts(self.run_id, str(p), artifact_path)
        elif p.is_file():
            client().log_artifact(self.run_id, str(p), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED."""
        client().set_terminated(self.run_id, status)

    def artifact_uri(self, artifact_path: str = "") -> str:
        """Where an artifact of this run lives."""
        base = str(client().get_run(self.run_id).info.artifact_uri)
        return f"{base}/{artifact_path}" if artifact_path else base

    def ui_url(self, mlflow_ui: str) -> str:
        """This run's page in the MLflow UI at ``mlflow_ui``."""
        return f"{mlflow_ui.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"


# -- registry ------------------------------------------------------------------------------------


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
    def uri(self) -> str:
        """``models:/<name>/<version>``."""
        return f"models:/{self.name}/{self.version}"

    def to_json(self) -> dict[str, Any]:
        """Plain-dict form for JSON output."""
        return {**asdict(self), "uri": self.uri}


def _info(mv: ModelVersion) -> VersionInfo:
    created = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(int(mv.creation_timestamp) / 1000))
    return VersionInfo(
        name=mv.name,
        version=str(mv.version),
        aliases=sorted(mv.aliases or []),
        run_id=str(mv.run_id or ""),
        source=str(mv.source),
        created=created,
        tags=dict(mv.tags or {}),
    )


def model_names() -> list[str]:
    """Every registered model's name."""
    return sorted(m.name for m in client().search_registered_models(max_results=1000))


def _check_model(name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client().get_registered_model(name)
    except MlflowException:
        names = model_names()
        known = ", ".join(names) if names else "none yet (robo-pipe run registers one)"
        raise RegistryError(f"no registered model {name!r}; registered models: {known}") from None


def versions(name: str) -> list[VersionInfo]:
    """Every version of ``name``, newest first."""
    _check_model(name)
    found = client().search_model_versions(f"name='{name}'")
    return sorted((_info(mv) for mv in found), key=lambda v: -int(v.version))


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


def champion(name: str) -> VersionInfo | None:
    """The current champion of ``name``, or None (no such model, or no champion yet)."""
    try:
        return get_version(name, CHAMPION)
    except RegistryError:
        return None


def parse_model_uri(uri: str) -> tuple[str, str]:
    """``models:/name@alias``, ``models:/name/3``, ``name@alias`` or ``name/3`` ->
    (name, version-or-alias)."""
    ref = uri.removeprefix("models:/")
    if "@" in ref:
        name, _, which = ref.partition("@")
    elif "/" in ref:
        name, _, which = ref.rpartition("/")
    else:
        raise RegistryError(f"{uri!r}: expected models:/<name>@<alias> or models:/<name>/<version>")
    if not name or not which:
        raise RegistryError(f"{uri!r}: expected models:/<name>@<alias> or models:/<name>/<version>")
    return name, which


def register_export(
    export_dir: Path,
    name: str,
    run: TrackedRun,
    tags: dict[str, str],
    description: str = "",
) -> VersionInfo:
    """Register the export at ``export_dir`` as a new version of ``name`` (created if missing),
    logged under ``run``'s artifacts, with ``tags``; alias it ``candidate``."""
    import mlflow.onnx
    import onnx
    from mlflow.exceptions import MlflowException

    mlflow_client = client()
    staging = home_dir("exports") / f".register-{run.run_id}"
    shutil.rmtree(staging, ignore_errors=True)
    model = onnx.load(str(export_dir / "policy.onnx"))  # with its external data
    spec = json.loads((export_dir / "io_spec.json").read_text())
    mlflow.onnx.save_model(
        model,
        str(staging),
        signature=model_signature(spec),
        pip_requirements=PIP_REQUIREMENTS,
        save_as_external_data=model.ByteSize() > 1_500_000_000,  # protobuf's 2 GB limit
        metadata={"robo_pipe_io_spec": "io_spec.json", **tags},
    )
    (staging / "io_spec.json").write_text(json.dumps({**spec, "onnx_file": "model.onnx"}, indent=1))
    for extra in ("tokenizer", "normalization.json", "reference.npz"):
        source = export_dir / extra
        if source.is_dir():
            shutil.copytree(source, staging / extra)
        elif source.is_file():
            shutil.copy2(source, staging / extra)
    run.log_artifact(staging, MODEL_DIR)
    shutil.rmtree(staging)
    try:
        mlflow_client.get_registered_model(name)
    except MlflowException:
        mlflow_client.create_registered_model(
            name, description=description or "robo-pipe policy (ONNX, see io_spec.json)"
        )
    mv = mlflow_client.create_model_version(
        name, source=run.artifact_uri(MODEL_DIR), run_id=run.run_id, tags=tags
    )
    mlflow_client.set_registered_model_alias(name, CANDIDATE, str(mv.version))
    return get_version(name, str(mv.version))


def model_signature(io_spec: dict[str, Any]) -> ModelSignature:
    """The MLflow signature of an export, from its ``io_spec.json``: every input and output by
    name, dtype and shape, the batch axis as -1 (any size)."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def schema(tensors: list[dict[str, Any]]) -> Schema:
        return Schema(
            [
                TensorSpec(
                    np.dtype(t["dtype"]),
                    tuple(-1 if dim == "batch" else int(dim) for dim in t["shape"]),
                    t["name"],
                )
                for t in tensors
            ]
        )

    return ModelSignature(inputs=schema(io_spec["inputs"]), outputs=schema(io_spec["outputs"]))


def set_version_description(name: str, version: str, description: str) -> None:
    """Set the description (markdown) the MLflow UI shows on a model version's page."""
    client().update_model_version(name, version, description=description)


def find_export(name: str, onnx_hash: str) -> VersionInfo | None:
    """The version of ``name`` registered from the export with ``onnx_hash``, if any."""
    if name not in model_names():
        return None
    for info in versions(name):
        if info.tags.get(TAG + "onnx_hash") == onnx_hash:
            return info
    return None


def set_alias(name: str, alias: str, version: str) -> VersionInfo:
    """Point ``alias`` of ``name`` at ``version``."""
    client().set_registered_model_alias(name, alias, version)
    return get_version(name, version)


def set_version_tags(name: str, version: str, tags: dict[str, Any]) -> None:
    """Tag a model version (values as strings)."""
    mlflow_client = client()
    for key, value in tags.items():
        mlflow_client.set_model_version_tag(name, version, key, str(value))


def failed_gates(info: VersionInfo) -> list[str]:
    """Names of the gates ``info`` failed when it was registered, from its tags."""
    return sorted(
        key[len(GATE_TAG) :]
        for key, value in info.tags.items()
        if key.startswith(GATE_TAG) and "." not in key[len(GATE_TAG) :] and value != "passed"
    )


def champion_history(name: str) -> list[str]:
    """Versions that were champion of ``name``, oldest first."""
    tags = client().get_registered_model(name).tags or {}
    history: list[str] = json.loads(tags.get(HISTORY_TAG, "[]"))
    return history


def promote(name: str, version: str, reason: str) -> VersionInfo:
    """Make ``version`` the champion of ``name`` and record it in the champion history."""
    info = get_version(name, version)
    mlflow_client = client()
    mlflow_client.set_registered_model_alias(name, CHAMPION, info.version)
    history = [v for v in champion_history(name) if v != info.version] + [info.version]
    mlflow_client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    set_version_tags(name, info.version, {TAG + "promoted_at": stamp, TAG + "promoted_by": reason})
    return get_version(name, info.version)


def rollback(name: str) -> VersionInfo:
    """Give ``champion`` back to the previous champion of ``name``."""
    current = champion(name)
    history = champion_history(name)
    if current is None:
        _check_model(name)
        raise RegistryError(f"{name} has no champion to roll back")
    earlier = [v for v in history if v != current.version]
    if not earlier:
        raise RegistryError(
            f"{name}: version {current.version} is the only champion there has been; "
            "nothing to roll back to"
        )
    previous = earlier[-1]
    client().set_registered_model_alias(name, CHAMPION, previous)
    client().set_registered_model_tag(name, HISTORY_TAG, json.dumps(earlier))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    set_version_tags(name, current.version, {TAG + "rolled_back_at": stamp})
    return get_version(name, previous)


def fetch_export(name: str, ref: str) -> tuple[VersionInfo, Path]:
    """Download version ``ref`` (number or alias) of ``name`` into
    ``$ROBO_PIPE_HOME/exports/registry/<name>/<version>`` (once) and return it with the
    directory, which the edge runtime and evaluation load like any export."""
    import mlflow.artifacts

    info = get_version(name, ref)
    target = home_dir("exports") / "registry" / name / info.version
    if (target / "io_spec.json").is_file():
        return info, target
    staging = target.with_name(f".{info.version}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    mlflow.artifacts.download_artifacts(f"models:/{name}/{info.version}", dst_path=str(staging))
    staging.rename(target)
    return info, target
