"""One pipeline run under Prefect: the flows, their stage tasks over the steps
(:mod:`pipelines.steps`), resume, and what a finished run publishes.

- :mod:`pipelines.run.flow`: the Prefect flows ``train_simulate_deploy`` and
  ``champion_regression`` (the entrypoints of ``prefect.yaml`` and of the served deployments).
- :mod:`pipelines.run.flow_run`: one flow run's name, its start (config, services, run folder,
  MLflow run, liveness lock, crashed runs found) and its end.
- :mod:`pipelines.run.tasks`: one Prefect task per stage, each a few lines over its step.
- :mod:`pipelines.run.stage_task`: what the stage tasks share: the stage names, the run's
  context, the retry condition and options, reuse-or-run then track (``run_stage``).
- :mod:`pipelines.run.reconcile`: the runs under way in a home (a liveness lock each) and the
  bookkeeping of one that crashed (Prefect ``Crashed``, MLflow ``KILLED``, ``continues:``).
- :mod:`pipelines.run.resume`: records of completed stages, keyed on what each was given.
- :mod:`pipelines.run.publish`: the run's result, summary files, Prefect artifacts and MLflow
  and registry descriptions; the flow run renamed after its outcome.
- :mod:`pipelines.run.summary`: the run's outcome (verdict state, title) and its markdown.
- :mod:`pipelines.run.tables`: the summary's tables (evaluation, variants, latency, gates).
- :mod:`pipelines.run.places`: where the run can be found later, and links to configured servers.
- :mod:`pipelines.run.expected`: what a first run of each shipped config takes, stage by stage
  (measured; printed as a run starts, quoted by the docs).
- :mod:`pipelines.run.plots`: the training curves and PNGs inlined as ``data:`` URIs.
"""
