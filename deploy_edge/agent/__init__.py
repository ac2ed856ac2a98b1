"""The edge agent: runs on each device and deploys signed releases.

- :mod:`deploy_edge.agent.config`: the device config (``DeviceConfig``, ``load_device_config``).
- :mod:`deploy_edge.agent.deployer`: the deployment sequence (verify, extract, engine, parity,
  gate, activate, health, commit), staging, rollback, status (``Deployer``).
- :mod:`deploy_edge.agent.intake`: the verify and extract steps: a release file in, a slot out.
- :mod:`deploy_edge.agent.trials`: the engine, parity and gate steps (and ``precision: auto``).
- :mod:`deploy_edge.agent.active`: running the active version: health check, episodes, the
  policy server's engine.
- :mod:`deploy_edge.agent.journaled_run`: a deployment under way, journaled step by step.
- :mod:`deploy_edge.agent.recovery`: undoing a deployment cut off before its commit.
- :mod:`deploy_edge.agent.slots`: the state directory's links and slots.
- :mod:`deploy_edge.agent.history`: every finished deployment.
- :mod:`deploy_edge.agent.floor`: the release floor, per model.
- :mod:`deploy_edge.agent.journal`: the durable journal, atomic link flips and file writes.
- :mod:`deploy_edge.agent.uploads`: resumable release uploads.
- :mod:`deploy_edge.agent.service`: the HTTP service (and ``WS /policy``) over a ``Deployer``.
- ``python -m deploy_edge.agent`` (:mod:`deploy_edge.agent.__main__`): runs the service.
"""
