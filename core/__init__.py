"""Shared domain of the control plane: settings, tables (ORM rows), job state machine,
services.

No FastAPI, no Celery, no torch here: `api/` and `workers/` both build on this package.
"""
