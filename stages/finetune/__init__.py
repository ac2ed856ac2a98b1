"""Training stages: ``pretrain`` (the base VLA) and ``finetune`` (LoRA/BC) on Ray Train.

The entry points are :func:`stages.finetune.run.pretrain` and :func:`stages.finetune.run.finetune`
(imported from there: this package's configs must stay importable without torch).
"""
