"""The evaluate stage: success rates with honest intervals, sharded over Ray, gated against a
baseline. Entry point: :func:`stages.evaluate.stage.evaluate`."""
