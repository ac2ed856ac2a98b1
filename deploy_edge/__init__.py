"""Edge deployment: bundle format, inference engines, control-loop runtime, edge agent.

Filled in by the export/latency-gate and deploy issues; it may import only ``robots``.
"""
