"""The export stage: a checkpoint to an ONNX file usable without the training code."""
