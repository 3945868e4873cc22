"""What a user writes about a job after submitting it: its labels and a free-text note."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.orm import Session

from core.jobs import service as jobs
from core.platform.tables import Job, utcnow


def update(
    *,
    session: Session,
    job_id: int,
    project_id: str,
    labels: Mapping[str, str] | None = None,
    note: str | None = None,
) -> Job:
    """Replace the job's labels (the whole set) and/or its note; None leaves one as it is, an
    empty note clears it. Any state, ended jobs too. The spec keeps the labels it was submitted
    with; the list's label filter and `Job.labels` see these. Raises NotFound (another
    project's job too). No commit."""
    job = jobs.get_or_raise(session=session, job_id=job_id, project_id=project_id)
    if labels is not None:
        job.labels = dict(labels)
    if note is not None:
        job.note = note or None
    job.updated_at = utcnow()
    session.flush()
    return job
