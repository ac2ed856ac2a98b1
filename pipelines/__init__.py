"""Orchestration: Prefect flows over the stages, the ``robo-pipe`` CLI, runs and their home."""
