"""Policy models shared by training, evaluation and export.

- :mod:`~stages.policy.base`: the policy interface (``VLAPolicy``), normalisation, the ONNX
  export wrapper.
- :mod:`~stages.policy.vla`: the default VLA (``policy.type: default``).
- :mod:`~stages.policy.hub_vla`: a pretrained VLM backbone with LoRA (``policy.type: hub-vlm``).
- :mod:`~stages.policy.presets`: hub-vlm backbone architectures (``policy.preset``) and
  building one with random weights (``policy.weights: random``, a systems test).
- :mod:`~stages.policy.tokenizer`: the default VLA's instruction tokenizer.
- :mod:`~stages.policy.checkpoint`: building policies, checkpoints (safetensors, no pickle).
"""
