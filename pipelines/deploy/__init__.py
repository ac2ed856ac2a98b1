"""Deploy, the pipeline's side: a registry version signed and sent to edge devices.

- :mod:`pipelines.deploy.release`: a version as a signed release (``bundle_release``) and that
  release on one device (``deploy_release``); the home's signing key.
- :mod:`pipelines.deploy.local_agent`: the edge agent on 127.0.0.1 and the pipeline's deploy
  stage onto it (``deploy_to_local_agent``).
- :mod:`pipelines.deploy.fleet`: a rollout to a fleet in waves (the ``deploy_fleet`` flow) and
  what each device of a fleet runs.
- :mod:`pipelines.deploy.rollout_summary`: a fleet rollout's markdown summary and its Prefect
  artifact key.

Imports run one way: ``local_agent`` and ``fleet`` use ``release``; none uses the other. The
devices themselves are :class:`deploy_edge.device.Device`, opened with
:func:`deploy_edge.device.connect`.
"""
