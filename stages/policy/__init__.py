"""Policy models shared by training, evaluation and export.

- :mod:`~stages.policy.base`: the policy interface (``VLAPolicy``), normalisation, the ONNX
  export wrapper.
- :mod:`~stages.policy.vla`: the default VLA (``policy.type: default``).
- :mod:`~stages.policy.hub_vla`: a pretrained VLM backbone with LoRA (``policy.type: hub-vlm``).
- :mod:`~stages.policy.presets`: hub-vlm backbone architectures (``policy.preset``) and
  building one with random weights (``policy.weights: random``, a systems test).
- :mod:`~stages.policy.pretrained`: pretrained image and sentence encoders, frozen, with a trained
  transformer (``policy.type: pretrained``); :mod:`~stages.policy.efficientnet_lite` its image
  encoder.
- :mod:`~stages.policy.config`: the ``policy:`` section, the architecture a checkpoint records,
  and the registry of policy types (``POLICY_TYPES``).
- :mod:`~stages.policy.tokenizer`: the default VLA's instruction tokenizer.
- :mod:`~stages.policy.checkpoint`: building policies, checkpoints (safetensors, no pickle).
- :mod:`~stages.policy.types`: the policy-type interface (``PolicyType``), the bases checkpoints
  stand on (``BaseRef``), picking a type by name or base kind (the registry is
  ``stages.policy.config.POLICY_TYPES``).
- :mod:`~stages.policy.default_type`, :mod:`~stages.policy.hub_type`,
  :mod:`~stages.policy.pretrained_type`: the ``default``, ``hub-vlm`` and ``pretrained`` types.
"""
