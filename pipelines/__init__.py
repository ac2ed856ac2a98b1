"""Orchestration: the stages wired together, Prefect flows over them, the ``robo-pipe`` CLI, the
registry, deploys to devices, and the home everything lives in. One floor up from the stages.

The base every wing uses:

- :mod:`pipelines.config`: the typed ``PipelineConfig`` (YAML, ``extends``, ``--set``).
- :mod:`pipelines.home`: ``$ROBO_PIPE_HOME`` and the folders in it.
- :mod:`pipelines.records`: the pipeline's own records (evaluation, registration, result).
- :mod:`pipelines.progress`: progress events from stages to whoever shows them.
- :mod:`pipelines.tracking`: MLflow runs; :mod:`pipelines.stores`: the embedded stores a home
  shares, created and migrated once.

The wings:

- :mod:`pipelines.steps`: the one wiring layer: each step maps config sections to one stage.
- :mod:`pipelines.run`: one pipeline run under Prefect (flows, stage tasks, summary, resume).
- :mod:`pipelines.registry`: MLflow model versions, their tag schema, the champion.
- :mod:`pipelines.deploy`: a version signed and sent to edge devices and fleets.
- :mod:`pipelines.serve`: Prefect deployments and schedules (``robo-pipe serve``), their health.
- :mod:`pipelines.services`: settings and checks, processes and signals, the local servers.
- :mod:`pipelines.cli`: the ``robo-pipe`` CLI, a floor above the other wings.
"""
