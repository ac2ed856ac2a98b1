"""The MLflow model registry: policy versions, aliases, their tags, promotion and rollback.

tags       the tag schema: every ``robo_pipe.*`` key written on a registered model or version
versions   resolve, list, tag and describe versions; the ``candidate``/``champion`` aliases
exports    an export registered as a version (an MLflow ``onnx`` model that is also a
           bundle), and a version downloaded back as one
promotion  the promotion lock, promotion and rollback (the alias and the champion history)
champion   the champion's bookkeeping: stored per-seed outcomes, the comparison's tags, the
           re-check under the promotion lock, the scheduled regression check
"""
