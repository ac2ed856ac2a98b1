"""The robot side of the agent's policy server: a light computer on the robot runs the control
loop, a nearby GPU box runs the policy.

The edge agent (:mod:`deploy_edge.agent.service`) serves its active version at ``WS /policy``
(``wss://`` when the agent has TLS), with the agent's bearer token in the handshake's
``Authorization: Bearer <token>`` header (a missing or wrong token: the handshake is answered
HTTP 401). The frames are JSON text, the records of :mod:`deploy_edge.wire` that both ends
import (``PolicyInfo``, ``ObservationFrame``, ``ChunkFrame``). Nothing deployed, or an
observation the policy cannot take: the frame's ``error`` says why (the connection stays open:
a version deployed later is served on the next observation).

- :mod:`deploy_edge.policy_client.remote_policy`: :class:`RemotePolicy`, a
  :class:`~deploy_edge.runtime.ChunkPolicy` over that socket, so the asynchronous loop
  (:class:`~deploy_edge.async_loop.AsyncControlLoop`) runs it like a local engine; any failure (a
  dropped socket, a dead server, a timeout, an error frame) raises out of ``infer``, which the
  loop turns into the safe action, and the next call reconnects.
- :mod:`deploy_edge.policy_client.remote_run`: that loop on a robot, and what it reports.
- ``python -m deploy_edge.policy_client`` (:mod:`deploy_edge.policy_client.__main__`): runs it
  on a robot driver (see ``--help``).

Imports numpy, ``websockets`` and the robot interface (``robots``, whose specs MuJoCo reads); no
torch, no ONNX Runtime, no tokenizer: what a robot's computer has.
"""
