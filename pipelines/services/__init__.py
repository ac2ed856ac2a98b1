"""The pipeline's services: where the Prefect API and the MLflow tracking server are, the
local servers of a home, and how the verbs that use them start and stop.

- ``settings.py``: :func:`configure` (the environment Prefect and MLflow read), the Prefect
  settings refresh, the checks that the configured services answer, joining a Ray cluster.
- ``processes.py``: a child process named by pid and start time, process groups, the
  parent-death signal.
- ``signals.py``: SIGTERM as Ctrl-C (``Stopped``), a lost Prefect server as a stop
  (``ServerLost``), the exit code of a stopped verb, signals held back while servers start or stop.
- ``local_servers.py``: the Prefect server and MLflow UI of ``ui``/``serve``
  (``LocalServers``), the temporary Prefect server of a run, stopping survivors, free ports.
"""
