"""The edge agent: runs on each device and deploys signed releases.

- :mod:`deploy_edge.agent.config`: the device config (``DeviceConfig``, ``load_device_config``).
- :mod:`deploy_edge.agent.deployer`: verify, extract, engine, parity, gate, activate, health,
  commit; automatic rollback; a crash-safe journal (``Deployer``).
- :mod:`deploy_edge.agent.journal`: the durable journal and atomic link flips.
- :mod:`deploy_edge.agent.service`: the HTTP service over a ``Deployer``.
"""
