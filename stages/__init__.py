"""Pipeline stages as plain functions over typed configs and artifact records (no Prefect)."""
