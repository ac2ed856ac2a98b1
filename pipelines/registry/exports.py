"""An export as a registered version, and back: register it, download it.

A version's directory is an MLflow ``onnx`` flavor model (``model.onnx``, ``MLmodel`` with the
signature: every input and output's name, dtype and shape) that is also a robo-pipe export
bundle (:mod:`deploy_edge.bundle`), its I/O spec pointing at ``model.onnx``. Its tags carry
what the export's I/O spec says of it (:func:`pipelines.registry.tags.spec_tags`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from deploy_edge.bundle.files import copy_bundle, verify_bundle
from deploy_edge.bundle.io_spec import IOSpec, TensorSpec, read_io_spec
from deploy_edge.bundle.layout import IO_SPEC_FILE
from pipelines.home import home_dir
from pipelines.registry.tags import spec_tags
from pipelines.registry.versions import (
    CANDIDATE,
    RANDOM_WEIGHTS_NOTE,
    VersionInfo,
    get_version,
)
from pipelines.tracking import TrackedRun, client

if TYPE_CHECKING:
    from mlflow.models import ModelSignature

MLFLOW_MODEL_FILE = "model.onnx"
"""The model's name in a registered version (MLflow's ``onnx`` flavor writes it)."""
MODEL_DIR = "policy"
"""Artifact path of the registered model inside the pipeline's MLflow run."""
PIP_REQUIREMENTS = ["onnxruntime", "tokenizers", "numpy"]
"""What running a registered policy needs (explicit: MLflow's inference of them is slow)."""


def register_export(
    export_dir: Path,
    name: str,
    run: TrackedRun,
    tags: dict[str, str],
    description: str = "",
) -> VersionInfo:
    """Register the export at ``export_dir`` as a new version of ``name`` (created if missing),
    logged under ``run``'s artifacts, with ``tags`` and the tags its I/O spec gives
    (:func:`~pipelines.registry.tags.spec_tags`, which win: they are what the bundle says);
    alias it ``candidate``. A random-weight policy's version description starts with
    :data:`~pipelines.registry.versions.RANDOM_WEIGHTS_NOTE`. The export is verified against
    its checksums first, and the registered copy gets its own."""
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
