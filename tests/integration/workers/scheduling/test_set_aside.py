"""A new attempt sets aside the checkpoints no attempt recorded (a worker lost between writing
one and its `checkpoint` event), the trainer's `step_XXXXXXXX` and a `transformers.Trainer`
script's `checkpoint-N` alike, so the run resumes from the latest recorded one."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from core.jobs import reports as queries
from core.jobs import service as jobs
from core.jobs import upserts
from core.platform.settings import Settings
from jobspec.job import parse_job_spec
from tests.conftest import ProjectKey
from tests.integration.s3server import s3_fs, under
from workers.checkpoints import ASIDE, set_aside_unrecorded


def test_unrecorded_step_and_trainer_checkpoints_are_set_aside(
    session: Session, project: ProjectKey, tmp_path: Path
) -> None:
    spec = parse_job_spec({"name": "aside", "data": {"uri": str(tmp_path)}})
    job = jobs.create(session=session, project_id=project.project_id, spec=spec).job
    for step in (10, 30):
        upserts.checkpoint(
            session=session, job_id=job.id, attempt=1, step=step, uri="x", size_bytes=0
        )
    names = ["step_00000010", "step_00000020", "checkpoint-30", "checkpoint-40", "notes"]
    for name in names:
        (tmp_path / name).mkdir()
    moved = set_aside_unrecorded(session=session, job_id=job.id, attempt=2, root=str(tmp_path))
    assert moved == [20, 40]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([ASIDE, "step_00000010", "checkpoint-30", "notes"])
    aside = sorted(p.name for p in (tmp_path / ASIDE).iterdir())
    assert aside == ["checkpoint-40.a2", "step_00000020.a2"]


def test_recorded_checkpoints_whose_directory_is_gone_are_forgotten(
    session: Session, project: ProjectKey, tmp_path: Path
) -> None:
    """Retention deleted step 10's directory, but its `checkpoint_deleted` event died with the
    worker: the next attempt forgets the row (and keeps the ones that exist or live elsewhere)."""
    spec = parse_job_spec({"name": "gone", "data": {"uri": str(tmp_path)}})
    job = jobs.create(session=session, project_id=project.project_id, spec=spec).job
    for step, uri in ((10, tmp_path / "step_00000010"), (20, tmp_path / "step_00000020")):
        upserts.checkpoint(
            session=session, job_id=job.id, attempt=1, step=step, uri=str(uri), size_bytes=0
        )
    upserts.checkpoint(
        session=session, job_id=job.id, attempt=1, step=5, uri="/elsewhere/x", size_bytes=0
    )
    (tmp_path / "step_00000020").mkdir()
    assert set_aside_unrecorded(session=session, job_id=job.id, attempt=2, root=str(tmp_path)) == []
    session.rollback()  # what was forgotten is committed: a worker's session ends without one
    assert [c.step for c in queries.checkpoints(session=session, job_id=job.id)] == [5, 20]


@pytest.mark.s3
def test_on_s3_a_half_written_unrecorded_checkpoint_is_set_aside_object_by_object(
    session: Session, project: ProjectKey, s3_settings: Settings
) -> None:
    """On a real S3 server (moto): a checkpoint whose writer died mid-way (some shards, a
    directory marker, no `.metadata`) moves aside whole; the recorded one stays."""
    root = f"{s3_settings.storage_url}/aside-{secrets.token_hex(3)}"
    spec = parse_job_spec({"name": "aside-s3", "data": {"uri": "/x"}})
    job = jobs.create(session=session, project_id=project.project_id, spec=spec).job
    upserts.checkpoint(
        session=session, job_id=job.id, attempt=1, step=10, uri=f"{root}/step_00000010",
        size_bytes=0,
    )  # fmt: skip
    fs = s3_fs()
    fs.pipe(under(f"{root}/step_00000010/.metadata"), b"m")
    fs.pipe(under(f"{root}/step_00000020/__0_0.distcp"), b"shard 0")
    fs.pipe(under(f"{root}/step_00000020/"), b"")  # a directory marker, as some writers make
    moved = set_aside_unrecorded(session=session, job_id=job.id, attempt=2, root=root)
    assert moved == [20]
    fs.invalidate_cache()
    left = sorted(p.rsplit("/", 1)[1] for p in fs.ls(under(root)))
    assert left == sorted([ASIDE, "step_00000010"])
    aside = under(f"{root}/{ASIDE}/step_00000020.a2/__0_0.distcp")
    assert fs.cat_file(aside) == b"shard 0"
