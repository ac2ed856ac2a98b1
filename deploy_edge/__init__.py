"""Edge deployment: the bundle and release formats, inference engines, the control-loop runtime
and latency gate, the edge agent, and the deploying side's view of a device (the ``Device``
interface, its kinds, the agent's wire records). It imports only ``robots``, ``robo_pipe`` and
``configs`` (``tests/test_layers.py``)."""
