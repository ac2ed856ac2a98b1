"""Edge deployment: what runs on a device, and the deploying side's view of one. It imports only
``robots``, ``robo_pipe`` and ``configs`` (``tests/test_layers.py``).

The formats:

- :mod:`deploy_edge.bundle`: the export bundle (layout, ``io_spec.json``, checksums, ONNX
  external data).
- :mod:`deploy_edge.release`: the signed release (header, manifest, signature, payload).
- :mod:`deploy_edge.keys`: Ed25519 signing keys.

Running a policy:

- :mod:`deploy_edge.engines`: inference engines (ONNX Runtime; TensorRT built on the target).
- :mod:`deploy_edge.exported`: an exported policy on an engine.
- :mod:`deploy_edge.precision`: the precision variants' registry and the rule ``auto`` chooses by.
- :mod:`deploy_edge.targets`: target profiles (``configs/targets/*.yaml``).
- :mod:`deploy_edge.runtime`: the synchronous control loop and what both loops share.
- :mod:`deploy_edge.async_loop`: the asynchronous control loop (inference beside actuation).
- :mod:`deploy_edge.latency`: the latency gate; :mod:`deploy_edge.latency_report` its report.

Talking to devices:

- :mod:`deploy_edge.wire`: the agent's answers and the policy server's frames (both ends).
- :mod:`deploy_edge.device`: the ``Device`` interface, the devices file, device kinds.
- :mod:`deploy_edge.client`: the HTTP edge agent as a ``Device``.
- :mod:`deploy_edge.fleet`: fleet files, the canary and waves, the abort threshold.

Above them, a floor up (nothing here imports them): :mod:`deploy_edge.agent`, the edge agent
that runs on each device, and :mod:`deploy_edge.policy_client`, the robot's side of the agent's
policy server.
"""
