"""Policy models shared by training, evaluation and export (work in progress: issue 4).

So far: the instruction tokenizer and the default VLA network. Still to come: the policy
interface (distribution over action chunks, trainable parameters, checkpoints, ``as_onnx``),
LoRA adapters, the pretrained-VLM type, and training on Ray Train.
"""
