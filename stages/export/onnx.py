"""Export a policy checkpoint to ONNX: the file the evaluation, the engines and the edge run.

    <out>/policy.onnx (+ policy.onnx.data)   the graph: normalisation inside, LoRA merged
    <out>/policy.int8.onnx (+ .data)          its static INT8 Q/DQ variant, scored against it
                                              (``export.variants``; :mod:`stages.export.quantize`)
    <out>/instruction_encoder.onnx (+ .data)  a policy with ``separate_instruction_graph``
                                              (``pretrained``): tokens -> instruction features,
                                              run once per episode; FP32 (never quantised)
    <out>/io_spec.json                        names, shapes, dtypes, units, control rate, chunk
    <out>/tokenizer/                          the policy's tokenizer files
    <out>/reference.npz                       reference inputs and torch outputs (parity checks)
    <out>/normalization.json                  the statistics the graph normalises with
    <out>/checksums.json                      size and sha256 of every file above

The bundle's layout and its I/O spec are owned by :mod:`deploy_edge.bundle`; this stage fills
them in. Parity is measured in :mod:`stages.export.parity`; the record handed on, and the reuse
of an export already there, are :mod:`stages.export.ref`'s. The checkpoint is verified against
its checksums before anything is built, and the bundle is written beside ``out``, synced and
swapped in (:func:`~robo_pipe.atomic.replace_dir`): a corrupt checkpoint, a failed parity
check, a full disk or a kill leave ``out`` as it was. An ``out`` that already holds a verified
export of this very checkpoint (same hash, rate and parity inputs) is returned as it is.

The graph comes from the policy's ``as_onnx`` wrapper, traced (:mod:`stages.export.graph`, opset 18)
with a dynamic batch axis, its weights in external data (``policy.onnx.data``: a graph past
2 GB cannot hold them in the protobuf). Parity against torch is measured on random inputs and
reported. A policy with ``separate_instruction_graph`` is exported as two graphs: the
instruction graph (its frozen sentence encoder) and the policy graph taking its features in
place of the tokens; parity is then the whole chain, tokens -> instruction graph -> policy graph
in ONNX Runtime against the torch policy on the tokens, and ``reference.npz`` holds both the
tokens and the torch features of them (each graph's reference inputs).

With a dataset and ``export.variants`` (:class:`~stages.export.config.ExportConfig`), each
variant is made from the FP32 file, calibrated on frames of some of the dataset's episodes and
scored on frames of the others (:mod:`stages.export.quantize`), and listed in the spec with its
figures; one past the error bar stays in the bundle marked ``candidate: false`` with the reason
(what was tried and why it may not ship; a device never runs it). The spec records the
export's wall time and the exporting process's peak resident memory, the parameter count and
whether the policy has random weights.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deploy_edge.bundle.files import verify_bundle, write_bundle_checksums
from deploy_edge.bundle.io_spec import (
    BATCH,
    InstructionGraph,
    IOSpec,
    TensorSpec,
    Variant,
    WeightsProvenance,
    read_io_spec,
    write_io_spec,
)
from deploy_edge.bundle.layout import (
    INSTRUCTION_FILE,
    IO_SPEC_FILE,
    NORMALIZATION_FILE,
    ONNX_FILE,
    REFERENCE_FILE,
    TOKENIZER_DIR,
)
from robo_pipe.atomic import discard_dead_temporaries, replace_dir, temporary_path
from robo_pipe.home import mark_home
from robo_pipe.integrity import CHECKSUMS_FILE, writing
from robots.spec import get_robot
from stages.export.config import ExportConfig
from stages.export.graph import export_graph
from stages.export.memory import COLLECT_FROM, check_session, peak_rss_mb, release_memory
from stages.export.parity import (
    PARITY_TOLERANCE,
    ExportError,
    dataset_inputs,
    example_instructions,
    measure_parity,
    random_inputs,
    torch_reference,
)
from stages.export.precisions import make_variants, variant_frames
from stages.export.ref import OPSET, ExportRef, existing_export, export_ref
from stages.policy.checkpoint import (
    checkpoint_hash,
    load_policy,
    read_policy_meta,
    verify_checkpoint,
)
from stages.policy.onnx_graph import OnnxPolicy, as_onnx
from stages.policy.types import BaseRef


def weights_provenance(checkpoint: str | Path) -> tuple[WeightsProvenance, ...]:
    """The pretrained encoders the checkpoint's base records (``base.sources`` in its
    policy.json: package, version, sha256, licence; not the local path); empty for a base
    that records none."""
    meta = read_policy_meta(checkpoint)
    if not meta.get("base"):
        return ()
    return tuple(
        WeightsProvenance(s.role, s.package, s.version, s.sha256, s.licence)
        for s in BaseRef.from_json(meta["base"]).sources
    )


def export(
    checkpoint: str | Path,
    out: str | Path,
    control_hz: float,
    seed: int = 0,
    dataset: str | Path | None = None,
    tolerance: float = PARITY_TOLERANCE,
    config: ExportConfig | None = None,
) -> ExportRef:
    """Export ``checkpoint`` into ``out`` (written beside, then renamed into place), made for
    ``control_hz``: the control rate of the robot it runs on (io_spec ``control_hz``, the rate
    the latency gate and the edge agent run it at).

    The checkpoint is verified first (:func:`~stages.policy.checkpoint.verify_checkpoint`): a
    file that differs from its checksums raises :class:`~robo_pipe.integrity.IntegrityError`
    before anything is written. When ``out`` already holds an export of this very checkpoint
    (same hash, control rate and parity inputs, within ``tolerance``, the same variants scored
    the same way) that verifies, it is returned as it is. Parity (largest |ONNX Runtime -
    torch| over the actions and stds, robot units) is measured on random inputs and, given
    ``dataset``, on real frames of it; above ``tolerance`` the export is refused and nothing
    replaces ``out``. ``config`` (default: FP32 only) names the precision variants to make;
    they need ``dataset`` (calibration and held-out scoring frames): without one the export is
    FP32 only and :attr:`ExportRef.note` says why. A full disk raises
    :class:`~robo_pipe.errors.OutOfSpaceError` and leaves ``out`` as it was.

    Raises:
        QuantizeError: variants asked for on a dataset of fewer than two episodes.
    """
    start = time.perf_counter()
    config = config or ExportConfig(variants=[])
    verified = verify_checkpoint(checkpoint)
    source_hash = checkpoint_hash(checkpoint, verified)
    out = Path(out)
    parity_inputs = {"random", "dataset"} if dataset is not None else {"random"}
    wanted: list[str] = list(config.variants) if dataset is not None else []
    note = (
        f"no dataset: FP32 only (export.variants {config.variants} need calibration frames)"
        if config.variants and dataset is None
        else ""
    )
    existing = existing_export(
        out, source_hash, float(control_hz), parity_inputs, tolerance, wanted, config
    )
    if existing is not None:
        return replace(existing, note=note)
    # The wrapper merges LoRA into the loaded policy itself: the export keeps one copy of the
    # weights, not two (4.4 GiB each at 1 B parameters).
    loaded = load_policy(checkpoint, verified)
    wrapper = as_onnx(loaded, merge_lora=config.lora == "merged", copy_weights=False).eval()
    del loaded
    policy = wrapper.policy
    discard_dead_temporaries(out.parent, of=out.name)  # killed exports' (never a live one's)
    staging = temporary_path(out)
    with writing(out, staging, kept=f"{out} is as it was"):
        staging.mkdir(parents=True)
        export_graph(wrapper, wrapper.dummy_inputs(batch=2), staging / ONNX_FILE)
        instruction_wrapper = wrapper.instruction_graph()
        separate = instruction_wrapper is not None  # an instruction graph of its own
        instruction_parameters = 0
        if instruction_wrapper is not None:
            tokens, mask = policy.tokenizer(example_instructions(policy))
            text_example = (torch.as_tensor(tokens), torch.as_tensor(mask))
            export_graph(instruction_wrapper, text_example, staging / INSTRUCTION_FILE)
            instruction_parameters = sum(p.numel() for p in instruction_wrapper.parameters())
        policy.tokenizer.save(str(staging / TOKENIZER_DIR))

        # Torch's side of every check first (parity on random images and states with real
        # instructions and on real dataset frames; the variants' frames), then the torch model
        # goes: ONNX Runtime's sessions of the graph never share the memory with it.
        references = {"random": torch_reference(wrapper, random_inputs(policy, seed))}
        if dataset is not None:
            references["dataset"] = torch_reference(wrapper, dataset_inputs(policy, Path(dataset)))
        split = (
            variant_frames(wrapper, Path(dataset), config)
            if wanted and dataset is not None
            else None
        )
        cfg, normalizer = policy.cfg, asdict(policy.normalizer)
        action_std = policy.action_std.numpy().copy()
        pad_id = int(policy.tokenizer([""])[0][0, -1])  # what padding fills in
        parameters = policy.parameter_counts()[1]
        del wrapper, instruction_wrapper, policy
        release_memory(collect=parameters >= COLLECT_FROM)

        session = check_session(staging / ONNX_FILE)
        encoder = check_session(staging / INSTRUCTION_FILE) if separate else None
        parity, text_error = {}, 0.0
        for name, reference in references.items():
            parity[name], text = measure_parity(reference, session, encoder)
            text_error = max(text_error, text)
        del session, encoder
        release_memory()
        if max(parity.values()) > tolerance:
            raise ExportError(
                f"{checkpoint}: ONNX Runtime differs from torch by {max(parity.values()):.2e} "
                f"(tolerance {tolerance:.0e}): {parity}"
            )
        # Each graph's reference inputs: the tokens (instruction graph) and, with an instruction
        # graph, the torch features of them (the policy graph's ``instruction``).
        random = references["random"]
        reference_file: dict[str, Any] = random.inputs | random.graph_inputs
        reference_file |= {f"expected_{k}": v for k, v in random.outputs.items()}
        np.savez(staging / REFERENCE_FILE, **reference_file)
        instruction = (
            None
            if not separate
            else _instruction_spec(
                reference_file["instruction"], text_error, instruction_parameters
            )
        )
        del references
        variants = (
            make_variants(split, action_std, staging, reference_file, wanted, config)
            if split is not None
            else ()
        )

        side, robot = cfg.image_size, get_robot(cfg.robot)
        spec = IOSpec(
            policy_type=cfg.type,
            inputs=(
                *(_tensor(f"image_{c}", "uint8", (side, side, 3), "RGB") for c in cfg.cameras),
                _tensor("state", "float32", (cfg.state_dim,), robot.state_units_text),
                *(
                    (_tensor("tokens", "int64", (cfg.max_tokens,), "token ids"),)
                    if instruction is None
                    else instruction.outputs  # the policy graph takes the instruction's features
                ),
                _tensor("token_mask", "int64", (cfg.max_tokens,), "1 = token, 0 = padding"),
                *(
                    (
                        _tensor(
                            "prefix",
                            "float32",
                            (cfg.chunk_len, cfg.action_dim),
                            f"the committed actions, {robot.action_units_text}",
                        ),
                        _tensor("prefix_mask", "float32", (cfg.chunk_len,), "1 = committed"),
                    )
                    if cfg.prefix_ticks
                    else ()
                ),
            ),
            outputs=tuple(
                _tensor(name, "float32", (cfg.chunk_len, cfg.action_dim), robot.action_units_text)
                for name in OnnxPolicy.output_names
            ),
            cameras=tuple(cfg.cameras),
            image_size=cfg.image_size,
            state_dim=cfg.state_dim,
            action_dim=cfg.action_dim,
            chunk_len=cfg.chunk_len,
            max_tokens=cfg.max_tokens,
            pad_id=pad_id,
            control_hz=float(control_hz),
            robot=cfg.robot,
            tokenizer=TOKENIZER_DIR,
            opset=OPSET,
            checkpoint=mark_home(str(Path(checkpoint).resolve())),
            checkpoint_hash=source_hash,
            parity_max_abs_error=max(parity.values()),
            parity=parity,
            onnx_file=ONNX_FILE,
            variants=variants,
            random_weights=cfg.random_weights,
            prefix_ticks=cfg.prefix_ticks,
            parameters=parameters,
            export_seconds=round(time.perf_counter() - start, 2),
            export_peak_rss_mb=round(peak_rss_mb(), 1),
            weights_sources=weights_provenance(checkpoint),
            instruction_graph=instruction,
            lora=config.lora,
        )
        write_io_spec(staging, spec)
        # The statistics the graph normalises with (already inside it): for inspection on the edge.
        (staging / NORMALIZATION_FILE).write_text(json.dumps(normalizer, indent=1))
        sums = write_bundle_checksums(staging)
        # Synced and swapped in: the old export stays whole at ``out`` until the new one is.
        replace_dir(staging, out)
    return replace(export_ref(out, spec, sums), note=note)


def update_variants(out: str | Path, variants: tuple[Variant, ...]) -> IOSpec:
    """Rewrite the export at ``out`` with ``variants`` as its spec's variants (their figures
    after the success test: ``success``, ``candidate``, ``reason``), atomically: the bundle is
    hard-linked beside ``out`` (no model byte is copied, however large), its ``io_spec.json``
    and ``checksums.json`` rewritten there and the whole swapped in
    (:func:`~robo_pipe.atomic.replace_dir`). A kill leaves the old bundle or the new one, each
    verifying. Only the figures may change: the variants' names and files must be those of
    the spec. Returns the new spec."""
    out = Path(out)
    sums = verify_bundle(out)
    spec = read_io_spec(out)
    if [(v.name, v.onnx_file) for v in spec.variants] != [(v.name, v.onnx_file) for v in variants]:
        raise ValueError(f"{out}: variants {[v.name for v in variants]} are not the bundle's")
    new = replace(spec, variants=variants)
    discard_dead_temporaries(out.parent, of=out.name)
    staging = temporary_path(out)
    with writing(out, staging, kept=f"{out} is as it was"):
        for rel in sums:
            if rel in (IO_SPEC_FILE, CHECKSUMS_FILE):
                continue
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(out / rel, staging / rel)
        write_io_spec(staging, new)
        write_bundle_checksums(staging, {k: v for k, v in sums.items() if k != IO_SPEC_FILE})
        replace_dir(staging, out)
    return new


def _instruction_spec(features: np.ndarray, error: float, parameters: int) -> InstructionGraph:
    """The spec of the instruction graph of ``parameters`` whose torch outputs on the reference
    tokens are ``features`` ``(N, L, F)``, with its parity ``error``."""
    length, width = features.shape[1:]
    return InstructionGraph(
        inputs=(
            _tensor("tokens", "int64", (length,), "token ids"),
            _tensor("token_mask", "int64", (length,), "1 = token, 0 = padding"),
        ),
        outputs=(
            _tensor(
                "instruction",
                "float32",
                (length, width),
                "sentence-encoder token features (padding rows 0)",
            ),
        ),
        parameters=parameters,
        parity_max_abs_error=error,
    )


def _tensor(name: str, dtype: str, shape: tuple[int, ...], units: str) -> TensorSpec:
    """One entry of the I/O spec; every tensor has a leading dynamic batch axis."""
    return TensorSpec(name, dtype, (BATCH, *shape), units)
