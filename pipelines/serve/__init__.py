"""``robo-pipe serve``: Prefect deployments from a config's ``schedules:``, the runner that
serves them, and the health of their schedules. (Edge devices are :mod:`pipelines.deploy`.)

- ``deployments.py``: one Prefect deployment per schedule, and :func:`serve`'s runner loop (its
  Prefect server watched and restarted, its stop bounded).
- ``schedules.py``: served schedules after a fault: stranded runs released, the downtime
  policy, the checks at ``serve`` start and every pass while it serves.
- ``schedule_health.py``: each schedule's ``ScheduleHealth`` (last run, next run, stalled and
  why), and the Prefect API reads the other modules share.
"""
