"""Deploy, the pipeline's side: a registry version signed and sent to edge devices.

- :mod:`pipelines.deploy.release`: a version as a signed release (``bundle_release``) and that
  release on one device (``deploy_release``); the home's signing key.
- :mod:`pipelines.deploy.local_agent`: the edge agent on 127.0.0.1 and the pipeline's deploy
  stage onto it (``deploy_to_local_agent``).
- :mod:`pipelines.deploy.device_steps`: what is done to one device of a fleet: its status
  read, the release deployed (the ``deploy_device`` task), its rollback, its progress row.
- :mod:`pipelines.deploy.fleet`: a rollout to a fleet in waves (the ``deploy_fleet`` flow),
  its dry-run plan, its stop on SIGINT/SIGTERM, and ``fleet status``.
- :mod:`pipelines.deploy.rollout_summary`: a fleet rollout's markdown summary and its Prefect
  artifact key.
- :mod:`pipelines.deploy.rollouts`: one record per rollout (``$ROBO_PIPE_HOME/rollouts``),
  written as it goes.
- :mod:`pipelines.deploy.followups`: after a rollout, from its record: retry the failed
  devices, resume it, roll the fleet back, and reconcile a rollout whose process was killed.

Imports run one way: ``release`` and ``rollouts`` at the base; ``local_agent`` and
``device_steps`` use ``release``; ``fleet`` uses ``device_steps``, ``release`` and ``rollouts``;
``followups`` uses ``rollouts`` (and ``device_steps``, ``release`` inside its functions, so the
CLI checks its input before Prefect loads). Nothing in the package imports ``fleet``.
The devices themselves are :class:`deploy_edge.device.Device`, opened with
:func:`deploy_edge.device.connect`.
"""
