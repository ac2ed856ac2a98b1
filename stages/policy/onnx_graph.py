"""The export wrappers of a policy: what ``torch.onnx.export`` traces (:class:`OnnxPolicy`, the
policy graph; :class:`OnnxInstructionEncoder`, a separate instruction graph), their input and
output names, shapes and units."""

from __future__ import annotations

import copy
from typing import ClassVar, Protocol, cast

import numpy as np
import torch
from peft.tuners.lora import LoraLayer
from torch import nn

from stages.policy.base import Encoded, Images, Tensor, VLAPolicy


def as_onnx(policy: VLAPolicy, merge_lora: bool = True, copy_weights: bool = True) -> OnnxPolicy:
    """A copy of ``policy`` wrapped for ``torch.onnx.export``: with LoRA merged into the base
    weights (``merge_lora``, one matmul per layer), or the adapters kept as their own tensors
    (the graph computes ``W x + B (A x) * scale``: the base weights stay as the base had them).
    ``copy_weights`` False wraps (and merges into) ``policy`` itself: for a caller that owns it
    and needs it no more (the export: a second copy of a 1 B model's weights is 4.4 GiB)."""
    model = (copy.deepcopy(policy) if copy_weights else policy).eval()
    if merge_lora:
        for module in model.modules():
            if isinstance(module, LoraLayer):
                module.merge()
    return OnnxPolicy(model)


class InstructionEncoding(Protocol):
    """What a policy with ``separate_instruction_graph`` adds: the instruction encoded once
    (token ids/mask -> features) by its own module, the rest of the policy from the features."""

    instruction_encoder: nn.Module
    """Token ids/mask int64 ``(B, L)`` -> instruction features float ``(B, L, F)``."""

    def encode_instruction(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """Token ids/mask ``(B, L)`` -> instruction features ``(B, L, F)``."""
        ...

    def encode_encoded(
        self, images: Images, state: Tensor, instruction: Tensor, token_mask: Tensor
    ) -> Encoded:
        """:meth:`VLAPolicy.encode` from instruction features."""
        ...


class OnnxPolicy(nn.Module):
    """Export wrapper: fixed input/output names, robot units in and out, no tokenizer.

    Inputs (in order): ``image_<camera>`` uint8 ``(B, H, W, 3)`` per camera, ``state`` float32
    ``(B, state_dim)`` robot units, then the instruction: ``tokens`` and ``token_mask`` int64
    ``(B, max_tokens)`` (from the tokenizer shipped beside the model), or, for a policy with
    ``separate_instruction_graph``, ``instruction`` float32 ``(B, max_tokens, F)`` (what
    :meth:`instruction_graph`'s graph computes from the tokens, once per episode) and
    ``token_mask``; a delay-conditioned policy then ``prefix`` float32 ``(B, chunk_len,
    action_dim)`` robot units and ``prefix_mask`` float32 ``(B, chunk_len)`` (1 = committed;
    all 0: nothing committed, :meth:`VLAPolicy.with_prefix`). Outputs: ``actions`` float32
    ``(B, chunk_len, action_dim)`` robot units
    (the Gaussian's mean) and ``action_std`` float32 ``(B, chunk_len, action_dim)``. State
    normalisation and action de-normalisation are inside.
    """

    output_names: ClassVar[list[str]] = ["actions", "action_std"]

    def __init__(self, policy: VLAPolicy) -> None:
        super().__init__()
        self.policy = policy
        self.cameras = policy.cfg.cameras
        self.separate = policy.separate_instruction_graph
        text = ["instruction", "token_mask"] if self.separate else ["tokens", "token_mask"]
        self.conditioned = policy.prefix_encoder is not None
        prefix = PREFIX_INPUTS if self.conditioned else []
        self.input_names = [f"image_{c}" for c in self.cameras] + ["state", *text, *prefix]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.cameras)
        images = dict(zip(self.cameras, inputs[:n], strict=True))
        state, text, token_mask = inputs[n : n + 3]
        prefix, prefix_mask = inputs[n + 3 :] if self.conditioned else (None, None)
        if self.separate:
            encoding = cast(InstructionEncoding, self.policy)
            normalized = (state - self.policy.state_mean) / self.policy.state_std
            features, _ = encoding.encode_encoded(images, normalized, text, token_mask)
            features = self.policy.with_prefix(features, prefix, prefix_mask)
            mean, log_std = self.policy.action_head(features), self.policy.log_std
        else:
            out = self.policy(images, state, text, token_mask, prefix, prefix_mask)
            mean, log_std = out.mean, out.log_std
        std = (log_std.exp() * self.policy.action_std).expand_as(mean)
        return self.policy.denormalize_actions(mean), std

    def instruction_graph(self) -> OnnxInstructionEncoder | None:
        """The instruction's own graph (None: the policy graph takes the tokens)."""
        if not self.separate:
            return None
        return OnnxInstructionEncoder(cast(InstructionEncoding, self.policy).instruction_encoder)

    def graph_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The policy graph's inputs from batched observations as numpy arrays (images,
        ``state``, ``tokens`` and ``token_mask``): as they are, or with an instruction graph
        the tokens replaced by the features the policy's instruction encoder gives them. A
        delay-conditioned graph's prefix inputs are passed on, or zeros (nothing committed)."""
        if self.conditioned and "prefix" not in inputs:
            inputs = inputs | self.no_prefix(len(inputs["state"]))
        if not self.separate:
            return {k: inputs[k] for k in self.input_names}
        encoding = cast(InstructionEncoding, self.policy)
        with torch.no_grad():
            features = encoding.encode_instruction(
                torch.as_tensor(inputs["tokens"]), torch.as_tensor(inputs["token_mask"])
            )
        given = inputs | {"instruction": features.numpy().astype(np.float32)}
        return {k: given[k] for k in self.input_names}

    def dummy_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        """Example inputs of the right shapes and dtypes (tracing, parity checks)."""
        cfg = self.policy.cfg
        size = cfg.image_size
        images = [torch.zeros(batch, size, size, 3, dtype=torch.uint8) for _ in self.cameras]
        tokens, mask = self.policy.tokenizer(["touch the red cube"] * batch)
        state = self.policy.state_mean.expand(batch, -1).clone()
        prefix = tuple(torch.as_tensor(v) for v in self.no_prefix(batch).values())
        if not self.separate:
            return (*images, state, torch.as_tensor(tokens), torch.as_tensor(mask), *prefix)
        encoding = cast(InstructionEncoding, self.policy)
        with torch.no_grad():
            features = encoding.encode_instruction(torch.as_tensor(tokens), torch.as_tensor(mask))
        return (*images, state, features, torch.as_tensor(mask), *prefix)

    def no_prefix(self, batch: int) -> dict[str, np.ndarray]:
        """The prefix inputs of ``batch`` observations with nothing committed (empty for a
        policy that is not delay-conditioned)."""
        if not self.conditioned:
            return {}
        cfg = self.policy.cfg
        return {
            "prefix": np.zeros((batch, cfg.chunk_len, cfg.action_dim), np.float32),
            "prefix_mask": np.zeros((batch, cfg.chunk_len), np.float32),
        }


PREFIX_INPUTS = ["prefix", "prefix_mask"]
"""The inputs a delay-conditioned policy graph adds (:class:`OnnxPolicy`)."""


class OnnxInstructionEncoder(nn.Module):
    """Export wrapper of a policy's instruction encoder (``instruction_encoder.onnx``): inputs
    ``tokens`` and ``token_mask`` int64 ``(B, max_tokens)``, output ``instruction`` float32
    ``(B, max_tokens, F)`` (padding rows zero). The runtime runs it once per new instruction."""

    input_names: ClassVar[list[str]] = ["tokens", "token_mask"]
    output_names: ClassVar[list[str]] = ["instruction"]

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.encoder(tokens, token_mask))
