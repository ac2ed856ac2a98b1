"""An exported policy on an engine: what the robot's computer runs. No training code.

Reads an export bundle (:mod:`deploy_edge.bundle`, written by ``stages/export``): its I/O spec,
the ONNX file, the tokenizer files, each verified against the bundle's checksums when it is
opened. Tokenizes instructions with the ``tokenizers`` library, feeds the engine, returns the
action chunk in robot units. A bundle with an instruction graph
(:class:`~deploy_edge.bundle.io_spec.InstructionGraph`: ``policy.type: pretrained``) has its
instruction encoded by that graph once per new instruction (on ONNX Runtime, whatever the
engine: it runs once per episode), the features cached by the instruction's text and fed to
the policy graph every tick; other bundles feed the tokens. Imports nothing from ``stages``:
an edge device needs only numpy, ``tokenizers`` and its engine.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from deploy_edge.bundle.files import bundle_files, model_files, verify_bundle
from deploy_edge.bundle.io_spec import IOSpec, IOSpecError, read_io_spec
from deploy_edge.bundle.layout import IO_SPEC_FILE, REFERENCE_FILE, TOKENIZER_FILE
from deploy_edge.engines import InferenceEngine, SlowedEngine, make_engine

__all__ = ["ExportedPolicy", "IOSpecError", "read_io_spec"]

INSTRUCTION_CACHE = 256
"""Distinct instructions whose features an open policy keeps (an episode has one)."""


class ExportedPolicy:
    """Observations -> action chunk through an engine (see module docstring).

    Opening one verifies the bundle (:func:`deploy_edge.bundle.files.verify_bundle`; an
    :class:`~robo_pipe.integrity.IntegrityError` names a file that differs and the check): the
    model, its external data and the reference outputs before the engine reads them (and, for
    TensorRT, builds a plan from them), the other files once the spec is known to agree with the
    model. Each file is hashed once.

    ``variant``: run that precision variant of the bundle (its own ONNX file, a Q/DQ graph of
    its precision; :class:`IOSpecError` if the bundle has none of that name) instead of the
    FP32 model; ``precision`` then is the variant's. ``variant`` None: the FP32 model, at
    ``precision`` (``fp16``: TensorRT's FP16 build of it). ``added_ms``: each inference of the
    policy graph sleeps this long first (a target profile's ``added_inference_ms``)."""

    def __init__(
        self,
        export_dir: str | Path,
        engine: str = "onnxruntime",
        precision: str = "fp32",
        threads: int = 1,
        variant: str | None = None,
        tolerance: float = 2e-2,
        added_ms: float = 0.0,
    ) -> None:
        from tokenizers import Tokenizer

        root = Path(export_dir)
        if root.suffix == ".onnx":
            root = root.parent
        self.spec: IOSpec = read_io_spec(root)
        spec = self.spec
        self.robot = spec.robot
        self.cameras = spec.cameras
        self.image_size = spec.image_size
        self.state_dim = spec.state_dim
        self.action_dim = spec.action_dim
        self.chunk_len = spec.chunk_len
        self.prefix_ticks = spec.prefix_ticks
        """Delay-conditioned: the committed actions :meth:`infer` takes (0: none)."""
        # The model file: policy.onnx, or what the spec names (a registry copy uses model.onnx);
        # a variant's own file.
        model = spec.onnx_file
        if variant is not None:
            chosen = spec.variant(variant)
            if chosen is None:
                names = ", ".join(v.name for v in spec.variants) or "none"
                raise IOSpecError(
                    f"{root / IO_SPEC_FILE}: no precision variant {variant!r} (variants: {names})"
                )
            model, precision = chosen.onnx_file, chosen.precision
        # What the engines read first; nothing is built from a file that differs.
        graph = spec.instruction_graph
        first = [p.name for p in model_files(root, model)] + [REFERENCE_FILE]
        if graph is not None:
            first += [p.name for p in model_files(root, graph.onnx_file)]
        verify_bundle(root, only=first)
        reference = _load_reference(root)
        self.engine: InferenceEngine = make_engine(
            root / model,
            engine,
            precision,
            threads,
            reference,
            explicit=variant is not None,
            tolerance=tolerance,
        )
        if added_ms > 0:  # a slower device played on this one (``added_inference_ms``)
            self.engine = SlowedEngine(self.engine, added_ms)
        self.variant: str = variant or self.engine.precision
        """What runs: the variant's name, or the precision the FP32 model runs in."""
        declared = (spec.input_names, spec.output_names)
        actual = (self.engine.input_names, self.engine.output_names)
        if declared != actual:
            raise IOSpecError(
                f"{root / IO_SPEC_FILE}: declares inputs {declared[0]} and outputs {declared[1]}, "
                f"but the model has {actual[0]} and {actual[1]}"
            )
        self.instruction_engine: InferenceEngine | None = None
        """The instruction graph's engine (None: the policy graph takes the tokens)."""
        if graph is not None:
            # ONNX Runtime whatever the profile's engine: it runs once per episode, where a
            # TensorRT build of the sentence encoder would cost more than it saves.
            path = root / graph.onnx_file
            self.instruction_engine = make_engine(path, "onnxruntime", threads=threads)
            declared = (graph.input_names, graph.output_names)
            actual = (self.instruction_engine.input_names, self.instruction_engine.output_names)
            if declared != actual:
                raise IOSpecError(
                    f"{root / IO_SPEC_FILE}: instruction_graph declares inputs {declared[0]} and "
                    f"outputs {declared[1]}, but {graph.onnx_file} has {actual[0]} and {actual[1]}"
                )
        self._instructions: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._instructions_lock = threading.Lock()  # the policy server infers from threads
        tokenizer_file = root / spec.tokenizer / TOKENIZER_FILE
        if not tokenizer_file.is_file():
            raise IOSpecError(f"{root}: tokenizer file {spec.tokenizer}/{TOKENIZER_FILE} missing")
        # The rest after the spec-vs-model check, which names a hand-edited spec more precisely.
        verify_bundle(
            root, only=[p.as_posix() for p in bundle_files(root) if p.as_posix() not in first]
        )
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.enable_padding(pad_id=spec.pad_id, length=spec.max_tokens)
        self.tokenizer.enable_truncation(max_length=spec.max_tokens)

    def tokenize(self, instructions: list[str]) -> dict[str, np.ndarray]:
        """``tokens`` and ``token_mask``, int64 ``(B, max_tokens)``."""
        encodings = self.tokenizer.encode_batch(instructions)
        return {
            "tokens": np.array([e.ids for e in encodings], dtype=np.int64),
            "token_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }

    def encode_instructions(self, instructions: list[str]) -> dict[str, np.ndarray]:
        """The policy graph's instruction inputs: ``instruction`` float32 ``(B, max_tokens,
        F)`` and ``token_mask``, each new instruction tokenized and run through the instruction
        graph once, then taken from the cache (an episode's instruction is encoded at its
        first tick). Needs an instruction graph."""
        assert self.instruction_engine is not None, "no instruction graph in this bundle"
        with self._instructions_lock:
            new = sorted({t for t in instructions if t not in self._instructions})
        if new:
            text = self.tokenize(new)
            features = self.instruction_engine.run(text)["instruction"]
            with self._instructions_lock:
                if len(self._instructions) + len(new) > INSTRUCTION_CACHE:
                    self._instructions.clear()
                for i, instruction in enumerate(new):
                    self._instructions[instruction] = (features[i], text["token_mask"][i])
        with self._instructions_lock:
            rows = [self._instructions[t] for t in instructions]
        return {
            "instruction": np.stack([f for f, _ in rows]),
            "token_mask": np.stack([m for _, m in rows]),
        }

    def time_instruction_encoding(self, instruction: str, runs: int) -> np.ndarray:
        """Seconds of ``runs`` encodings of ``instruction`` (tokenization and the instruction
        graph, uncached: what the first tick of an episode adds), after one untimed run; empty
        without an instruction graph."""
        engine = self.instruction_engine
        if engine is None:
            return np.zeros(0)
        engine.run(self.tokenize([instruction]))
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            engine.run(self.tokenize([instruction]))
            seconds.append(time.perf_counter() - start)
        return np.array(seconds)

    def feeds(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> dict[str, np.ndarray]:
        """Engine inputs for a batch: images uint8 ``(B, H, W, 3)``, state ``(B, state_dim)``."""
        feeds = {
            f"image_{c}": np.ascontiguousarray(images[c], dtype=np.uint8) for c in self.cameras
        }
        feeds["state"] = np.ascontiguousarray(state, dtype=np.float32)
        if self.instruction_engine is None:
            return feeds | self.tokenize(instructions)
        return feeds | self.encode_instructions(instructions)

    def reference_feeds(self, reference: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The policy graph's inputs for reference inputs (``reference.npz``'s, a slice of
        them): with an instruction graph, its ``instruction`` is computed here from the
        reference tokens, so that a parity check covers the chain the episodes run."""
        feeds = {n: reference[n] for n in self.engine.input_names if n != "instruction"}
        if self.instruction_engine is not None:
            text = {n: reference[n] for n in self.instruction_engine.input_names}
            feeds["instruction"] = self.instruction_engine.run(text)["instruction"]
        return {n: feeds[n] for n in self.engine.input_names}

    def infer(
        self,
        images: dict[str, np.ndarray],
        state: np.ndarray,
        instructions: list[str],
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Mean action chunk, float32 ``(B, chunk_len, action_dim)``, robot units. A
        delay-conditioned policy (:attr:`prefix_ticks`) is given the committed prefix
        (``prefix`` ``(B, chunk_len, action_dim)``, ``prefix_mask`` ``(B, chunk_len)``; None:
        nothing committed); another ignores it."""
        feeds = self.feeds(images, state, instructions)
        if self.prefix_ticks:
            batch = len(feeds["state"])
            if prefix is None or prefix_mask is None:  # nothing committed
                prefix = np.zeros((batch, self.chunk_len, self.action_dim), np.float32)
                prefix_mask = np.zeros((batch, self.chunk_len), np.float32)
            feeds["prefix"] = np.ascontiguousarray(prefix, dtype=np.float32)
            feeds["prefix_mask"] = np.ascontiguousarray(prefix_mask, dtype=np.float32)
        out = self.engine.run(feeds)
        return np.asarray(out["actions"], dtype=np.float32)


def _load_reference(root: Path) -> dict[str, np.ndarray] | None:
    path = root / REFERENCE_FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
