"""Celery workers: claim a job, launch and supervise torchrun, ingest its output, reconcile.

`workers.app:app` is the Celery app; `python -m workers` starts a worker. The trainer runs as a
process (`torchrun ... -m trainer`): nothing here imports trainer code except `jobspec.job`.
"""
