"""The pipeline's steps: each stage called with a pipeline config. The one wiring layer.

Every step maps the config's sections to a stage's arguments, puts its output under
``$ROBO_PIPE_HOME``, reports progress to a :class:`~pipelines.progress.Listener` and returns
the stage's typed record. The CLI verbs and the Prefect tasks both call these and hold no
stage logic of their own::

    collect_dataset(cfg) -> DatasetRef
    pretrain_base(cfg) -> CheckpointRef | None            (the default VLA's base; cached)
    finetune_policy(cfg, dataset, base) -> CheckpointRef  (BC, then PPO/SAC/GRPO if configured)
    export_checkpoint(cfg, checkpoint, out) -> ExportRef
    evaluate_policy(cfg, policy, out) -> EvalReport        (one suite, optional baseline)
    evaluate_candidate(cfg, export, base, champion, out) -> Evaluation  (the pipeline's)
    measure_latency(cfg, export, out) -> LatencyReport
    register_version(cfg, lineage..., evaluation, latency, run) -> Registration
    evaluate_champion(cfg, out) -> ChampionCheck

The stage packages (and torch) are imported when a step runs, not when its module is imported.

- :mod:`pipelines.steps.checks`: the checks of a command's inputs, run before any work starts.
- :mod:`pipelines.steps.collect`: demonstrations into a dataset (``collect_dataset``).
- :mod:`pipelines.steps.training`: the default VLA's base (``pretrain_base``) and fine-tuning,
  behaviour cloning then RL (``finetune_policy``, ``rl_finetune_from``).
- :mod:`pipelines.steps.export`: a checkpoint as an ONNX bundle (``export_checkpoint``).
- :mod:`pipelines.steps.evaluate`: a policy on the evaluation suite (``evaluate_policy``), the
  pipeline's candidate (``evaluate_candidate``), its precision variants against FP32
  (``score_variant_success``), the champion's regression check (``evaluate_champion``).
- :mod:`pipelines.steps.latency`: the latency gate on the target profile (``measure_latency``).
- :mod:`pipelines.steps.register`: the export as a gated registry version (``register_version``).
"""
