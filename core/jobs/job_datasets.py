"""Which datasets a job names: a `job_datasets` row per spec field naming a dataset of the
job's project, written with the job (`core.jobs.service.add_queued`), so a dataset's page and
`GET /v1/jobs?dataset=` list the jobs that used it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import insert, literal, select
from sqlalchemy.orm import Session

from core.platform.tables import Dataset, Job, JobDataset
from jobspec.job import AnySpec

# Spec keys whose string value names a dataset of the project (`data.dataset`,
# `data.eval_dataset`, each evaluation's `dataset`, an inline lm-eval task's `dataset`).
DATASET_KEYS = ("dataset", "eval_dataset")


def dataset_fields(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(dotted field path, value) of every `DATASET_KEYS` string in a dumped spec, list
    indices as path parts: `("data.dataset", "ds_1")`, `("evaluate.evaluations.0.dataset",
    "ds_2")`. Migration 0021 holds a frozen copy."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key in DATASET_KEYS and isinstance(value, str):
                yield where, value
            else:
                yield from dataset_fields(value, where)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from dataset_fields(value, f"{path}.{index}")


def record(session: Session, job: Job, spec: AnySpec) -> None:
    """A `job_datasets` row per field of `spec` naming a dataset of the job's project (by
    id: submission pins names to ids; a path, or a name that is no dataset, is skipped)."""
    for field, value in dataset_fields(spec.model_dump(mode="json")):
        if len(field) > 200:
            continue
        # one INSERT ... SELECT a field (a spec names one or two): on the submit path, a
        # SELECT then an ORM insert cost ~10% of the API's throughput (bench.api)
        owned = select(literal(job.id), Dataset.id, literal(field)).where(
            Dataset.id == value, Dataset.project_id == job.project_id
        )
        session.execute(insert(JobDataset).from_select(["job_id", "dataset_id", "field"], owned))
