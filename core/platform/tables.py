"""The tables, one SQLAlchemy 2.0 ORM row class each. Alembic migrations in `migrations/` are the
only way they change.

Every resource hangs off a project; API keys belong to one project and see only its rows.

One module of ~900 lines, on purpose: every table on one declarative `Base`, read side by side with
the Alembic revisions that are their only way to change; the relationships name each other, and
splitting them by domain would make every domain package import every other's rows.
"""

from __future__ import annotations

import enum
import functools
import json
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    cast,
    type_coerce,
)
from sqlalchemy import false as sa_false
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from jobspec.job import AnySpec, parse_job_spec
from jobspec.stored import read_stored_spec, stored_problems

# Postgres gets JSONB, SQLite plain JSON text.
JsonType = JSON().with_variant(JSONB(), "postgresql")


class SpecType(TypeDecorator[AnySpec]):
    """A job spec (`JobSpec`, or `ScriptJobSpec` for a job with `entrypoint`) stored as JSON:
    validated once when the row is read (as the kind it is), dumped when written.

    Code that reads `Job.spec` gets the typed spec with its defaults (no `.get("x", default)`
    on dicts). Reading never raises: a spec of an older version is upgraded, and one that no
    longer validates is read leniently with its repairs recorded (`jobspec.stored`,
    `Job.spec_problems`); the row itself is left as stored.
    """

    impl = JsonType
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        return parse_job_spec(value).model_dump(mode="json")

    def column_expression(self, column: Any) -> Any:
        """Selected as its JSON text: the text is the cache key of `_read_spec`, so a spec read
        before costs no JSON decoding at all (SQLite's JSON type still decodes it)."""
        return type_coerce(cast(column, Text), self)

    def process_result_value(self, value: Any, dialect: Dialect) -> AnySpec | None:
        if value is None:
            return None
        if isinstance(value, str):
            return _read_spec(value)
        try:
            key = orjson.dumps(value).decode()
        except TypeError:  # what orjson cannot write (an integer beyond 64 bits): not cached
            return read_stored_spec(value)
        return _read_spec(key)


@functools.lru_cache(maxsize=1024)
def _read_spec(stored: str) -> AnySpec:
    """The spec stored as the JSON `stored`, parsed once per distinct content: a job's spec never
    changes after submission, and a page of 50 jobs parsed 50 specs (~60 us each) on every
    read. Callers share the object: a spec read from the database is never modified in place
    (`model_copy(update=...)` makes a changed one)."""
    try:
        return read_stored_spec(orjson.loads(stored))
    except orjson.JSONDecodeError:  # what orjson refuses (an integer beyond 64 bits)
        return read_stored_spec(json.loads(stored))


# SQLite autoincrements only INTEGER PRIMARY KEY columns.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime) -> datetime:
    """`value` with its timezone: SQLite hands back naive datetimes, which are UTC here."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        datetime: DateTime(timezone=True),
        dict[str, Any]: JsonType,
    }


class JobState(enum.StrEnum):
    """Job lifecycle states (see core/jobs/service.py for the allowed transitions)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    # The trainer was asked to checkpoint and stop for a pause (as `cancelling` for a cancel).
    PAUSING = "pausing"
    PAUSED = "paused"
    # The trainer was asked to checkpoint and stop for a job of higher priority (as `pausing`);
    # the job then goes back to `queued` (core/scheduling/preemption_apply.py).
    PREEMPTING = "preempting"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # A sweep trial stopped early by its sweep's pruner (core/sweeps/prune.py), through
    # `cancelling`: a verdict on the run's promise, not a failure and not a user's cancel.
    PRUNED = "pruned"


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PRUNED}
)


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# Every API-key scope (core.access.auth.Permission's values), in the order the API lists them.
ALL_SCOPES = ("jobs:read", "jobs:write", "datasets:write", "admin")
ALL_SCOPES_JSON = '["jobs:read", "jobs:write", "datasets:write", "admin"]'


class ApiKey(Base):
    """An API key. Only the sha256 of the secret is stored; `prefix` finds the row."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    # 0015_identity: who owns the key (a member or a service account; neither for keys made
    # before 0015 and for owner-less keys, which use `role`), what it may do, and when.
    member_id: Mapped[str | None] = mapped_column(
        ForeignKey("project_members.id", ondelete="SET NULL"), default=None
    )
    service_account_id: Mapped[str | None] = mapped_column(
        ForeignKey("service_accounts.id", ondelete="SET NULL"), default=None
    )
    scopes: Mapped[list[str]] = mapped_column(
        JsonType, default=lambda: list(ALL_SCOPES), server_default=ALL_SCOPES_JSON
    )
    role: Mapped[str | None] = mapped_column(String(20), default="admin")
    org_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(200))
    uri: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    num_files: Mapped[int] = mapped_column(Integer)
    # One of dataformat.records.FORMATS, declared or detected at registration (0007).
    format: Mapped[str] = mapped_column(String(20), default="text", server_default="text")
    # core.datasets.stats.DatasetStats as JSON; None for `text` (nothing counted record-wise).
    stats: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)
    # A `text` directory's file filter, part of the dataset: a job on it reads only these files
    # (0023). None for a file, and for a directory registered before 0023.
    include: Mapped[list[str] | None] = mapped_column(JsonType, nullable=True)
    exclude: Mapped[list[str] | None] = mapped_column(JsonType, nullable=True)
    # The selected files that are not UTF-8 text, never read: core.datasets.service.LeftOut.
    left_out: Mapped[dict[str, Any] | None] = mapped_column(JsonType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CodeArchive(Base):
    """An uploaded code archive (`POST /v1/code`) that `entrypoint.code` names: stored once per
    content (`sha256` of the archive's bytes) in the project's storage, unpacked by the worker
    for each attempt (docs/CONTRACTS.md section 5)."""

    __tablename__ = "code_archives"
    __table_args__ = (UniqueConstraint("project_id", "sha256"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(200))
    uri: Mapped[str] = mapped_column(Text)  # the archive file in storage (fsspec URI)
    format: Mapped[str] = mapped_column(String(10))  # `tar.gz` | `zip`
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # the archive's
    unpacked_bytes: Mapped[int] = mapped_column(BigInteger)
    # The regular files' paths, relative and normalised ("src/train.py"), sorted.
    files: Mapped[list[str]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key"),
        Index("ix_jobs_project_id_id", "project_id", "id"),
        # The jobs list's other sort orders (core/jobs/listing.py): keyset pages by index.
        Index("ix_jobs_project_id_name_id", "project_id", "name", "id"),
        Index("ix_jobs_project_id_state_id", "project_id", "state", "id"),
        Index("ix_jobs_state_pool", "state", "pool"),
        # The scheduler's order: a pool's queued jobs by priority, then age
        # (core/scheduling/claim.py).
        Index("ix_jobs_pool_state_priority_id", "pool", "state", "priority", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(20), default=JobState.QUEUED)
    spec: Mapped[AnySpec] = mapped_column(SpecType())
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    pool: Mapped[str] = mapped_column(String(100), default="default")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    request_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)
    current_step: Mapped[int | None] = mapped_column(Integer, default=None)
    max_steps: Mapped[int] = mapped_column(Integer)
    latest_metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # Seconds the trainer trained, all ended attempts together (for `limits.max_runtime_s`).
    runtime_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # The name of the API key that submitted the job (None for jobs from before 0003).
    owner: Mapped[str | None] = mapped_column(String(100), default=None)
    # Failure restarts since submission or the last manual retry: all classes, and per
    # failure class ({"oom": 1, ...}); core.attempts.lifecycle_policy decides from them (0008).
    restarts_used: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    restarts_by_class: Mapped[dict[str, Any]] = mapped_column(
        JsonType, default=dict, server_default="{}"
    )
    # The latest failed attempt: core.attempts.lifecycle_policy.Failure.to_json() (class, reason,
    # rank, ...).
    failure: Mapped[dict[str, Any] | None] = mapped_column(JsonType, default=None)
    # Devices one node of the job needs (resources.procs_per_node): what a worker's claim
    # compares with its free devices.
    slots: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Why the scheduler last passed this queued job over (`quota gpus 2/2`, ...); None once
    # claimed or never passed over (core.scheduling.claim, 0014_quotas).
    wait_reason: Mapped[str | None] = mapped_column(Text, default=None)
    # A free-text note set with `PATCH /v1/jobs/{id}` (0016_job_note).
    note: Mapped[str | None] = mapped_column(Text, default=None)
    # The lowest finite `loss` / `eval_loss` reported, kept at ingest (0016_job_note).
    best_loss: Mapped[float | None] = mapped_column(Float, default=None)
    best_eval_loss: Mapped[float | None] = mapped_column(Float, default=None)

    @property
    def spec_problems(self) -> list[str]:
        """What had to be repaired to read the stored spec (`jobspec.stored`): empty for
        every job this release submitted; a job with problems is shown but never started."""
        return stored_problems(self.spec)


class JobEvent(Base):
    """What happened to a job: state changes, checkpoints, samples, errors."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    kind: Mapped[str] = mapped_column(String(20))
    state_from: Mapped[str | None] = mapped_column(String(20), default=None)
    state_to: Mapped[str | None] = mapped_column(String(20), default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class MetricPoint(Base):
    """One value of one series at one step. Keyed, so re-ingestion upserts.

    On Postgres the foreign key to `jobs` is replaced by a delete trigger on `jobs` (migration
    0004: its per-row check cost more than the insert); the table also feeds `metric_rollups`
    through a statement trigger."""

    __tablename__ = "metric_points"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    time: Mapped[float] = mapped_column(Float)


class MetricRollup(Base):
    """The minimum and maximum points of one series over one block of steps: `step >> shift ==
    bucket`, `shift = 2 * level + 2` (16 to 1,048,576 steps). Kept by a Postgres trigger on
    `metric_points` (migration 0004); read by `core.jobs.rollups`. Empty on SQLite."""

    __tablename__ = "metric_rollups"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    min_step: Mapped[int] = mapped_column(Integer)
    min_value: Mapped[float] = mapped_column(Float)
    max_step: Mapped[int] = mapped_column(Integer)
    max_value: Mapped[float] = mapped_column(Float)


class LogLine(Base):
    """A line a rank (or the launcher, rank -1) printed. Keyed by its byte offset in its file."""

    __tablename__ = "log_lines"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "rank", "stream", "offset"),
        Index("ix_log_lines_job_id_id", "job_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(10))
    offset: Mapped[int] = mapped_column(BigInteger)
    line: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobDataset(Base):
    """A dataset a job's spec names (`field`: where, e.g. `data.dataset`,
    `data.eval_dataset`, `evaluate.evaluations.0.dataset`), written with the job at submission
    (`core.jobs.service.add_queued`), so a dataset's page lists the jobs that used it."""

    __tablename__ = "job_datasets"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    field: Mapped[str] = mapped_column(String(200), primary_key=True)


class Evaluation(Base):
    """One evaluation an eval job ran (`jobspec.evaluate`) on a checkpoint of `source_job_id`:
    its `metrics` ({name: value}) and, for `generate`, its `samples` (prompt, reference,
    answer and scores of each). A retried attempt replaces the row (one per job and name).
    `checkpoint_id` is no foreign key: retention may delete the checkpoint, the results stay."""

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("job_id", "name"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    source_job_id: Mapped[int] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    checkpoint_id: Mapped[int | None] = mapped_column(BigInteger, default=None)
    step: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(20))
    dataset: Mapped[str | None] = mapped_column(String(100), default=None)
    metrics: Mapped[dict[str, Any]] = mapped_column(JsonType)
    samples: Mapped[list[dict[str, Any]]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ExportState(enum.StrEnum):
    """States of a checkpoint export: `pending -> running -> ready | failed`."""

    PENDING = "pending"
    RUNNING = "running"
    READY = "ready"
    FAILED = "failed"


class CheckpointExport(Base):
    """A consolidated safetensors export of one checkpoint (`POST .../export`), written by a
    worker (`workers.export_checkpoint`) to `uri` (`model.safetensors` + `config.json`).

    `checkpoint_id` is deliberately not a foreign key: retention deletes the checkpoint row
    with its files, and an export that is ready by then stays downloadable. `attempt` fences
    the worker that claimed it (a stale claim is taken over with `attempt + 1`).
    """

    __tablename__ = "checkpoint_exports"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    checkpoint_id: Mapped[int] = mapped_column(BigInteger, unique=True)
    step: Mapped[int] = mapped_column(Integer)
    source_uri: Mapped[str] = mapped_column(Text)
    uri: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(20), default=ExportState.PENDING)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class JobNode(Base):
    """One node slot of a multi-node (gang) attempt: `resources.nodes` rows per attempt.

    Node 0 is the first claimant; it publishes the c10d rendezvous endpoint (`host`, `port`).
    A slot is taken by a fencing UPDATE (`worker IS NULL`), so a duplicated join message
    cannot start a second trainer for the same node (core/attempts/gang.py).
    """

    __tablename__ = "job_nodes"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)
    # The worker's advertised host; node 0's `host:port` is the rendezvous endpoint.
    host: Mapped[str | None] = mapped_column(String(255), default=None)
    port: Mapped[int | None] = mapped_column(Integer, default=None)
    joined_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    # Why this node's worker stopped its trainer (workers.supervisor.Stop), if it did.
    stop: Mapped[str | None] = mapped_column(String(20), default=None)
    # The trainer's `completed` report, on the node whose rank reported it.
    completed: Mapped[dict[str, Any] | None] = mapped_column(JsonType, default=None)
    # The device indices this node was given (CUDA_VISIBLE_DEVICES, or CPU slots) (0008).
    devices: Mapped[list[int] | None] = mapped_column(JsonType, default=None)
    # How this node failed: core.attempts.lifecycle_policy.Failure.to_json(), None when it did not.
    failure: Mapped[dict[str, Any] | None] = mapped_column(JsonType, default=None)
    # CPU-seconds (user + system) of this node's torchrun process tree, measured by its worker
    # while it runs and at its end (0013).
    cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class Worker(Base):
    """A worker process, as its own heartbeat thread last wrote it (`workers.liveness`).

    `started_at` is the incarnation: a restart under the same `name` writes a later one, so a
    job claimed before it (`jobs.started_at`) or a gang node joined before it
    (`job_nodes.joined_at`) belonged to a process that is gone. `heartbeat_at` is written every
    `worker_heartbeat_interval_s`; older than `worker_timeout_s` means the process is gone
    (the reconciler, `workers.reconcile`). Both come from the worker's own clock (0009).
    """

    __tablename__ = "workers"

    # The name a worker records on what it claims (`jobs.worker`, `job_nodes.worker`).
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    pool: Mapped[str] = mapped_column(String(200))  # the queues it serves, comma-separated
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column()
    heartbeat_at: Mapped[datetime] = mapped_column()
    slots_total: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    slots_free: Mapped[int | None] = mapped_column(Integer, default=None)
    # Set once its warm shutdown began: it takes no new work and hands its jobs back.
    stopping: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    # How it contains its jobs' ranks (workers/isolation/sandbox.py, 0018): `bwrap`, or
    # `none: <why>`.
    sandbox: Mapped[str | None] = mapped_column(String(500), default=None)


class SlurmJob(Base):
    """A job placed on a Slurm pool: one `sbatch` of it (`workers.slurm`, 0022).

    The submitter writes the row (`state` SUBMITTING) before it calls `sbatch`, so a repeated
    `workers.run_job` delivery finds a live placement (`ended_at` IS NULL) and submits nothing;
    its watcher keeps `state` (Slurm's `job_state`), `reason` (Slurm's `state_reason`) and
    `start_at` (the actual or expected start) fresh from `squeue --json`, and sets `ended_at`
    once Slurm says the job is over. The node agents of the allocation claim the job
    themselves (`jobs.worker` = `slurm-<slurm_job_id>.<requeues>@<host>`); `claimed` says one did.
    """

    __tablename__ = "slurm_jobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    pool: Mapped[str] = mapped_column(String(200))
    slurm_job_id: Mapped[int | None] = mapped_column(Integer, default=None, index=True)
    state: Mapped[str] = mapped_column(String(40), default="SUBMITTING")
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    start_at: Mapped[datetime | None] = mapped_column(default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    claimed: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)


class Controller(Base):
    """A controller process (`workers.controller`), as its own rounds last wrote it (0017).

    Each round, leading or standing by, writes `seen_at` and `leading`; a leader that finished a
    reconcile writes `reconciled_at`. `GET /readyz` and the dashboard read the latest
    `reconciled_at` of all rows (`core.platform.control`) to say when no reconcile ran for a few
    intervals: lost workers, hangs, preemption and gang timeouts are then unhandled. Times come
    from the controller's own clock, compared with the API's (hosts keep NTP time).
    """

    __tablename__ = "controllers"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)  # "<host>:<pid>"
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column()
    seen_at: Mapped[datetime] = mapped_column()
    leading: Mapped[bool] = mapped_column(Boolean, default=False)
    reconciled_at: Mapped[datetime | None] = mapped_column(default=None, index=True)


class AuditEvent(Base):
    """One audited request (api.audit): every mutating request and every 401/403 (0011).

    `project_id` is the caller's project, None when the request had none (a bad key).
    `outcome` is `ok` (status < 400), `denied` (401, 403) or `failed` (any other error).
    """

    __tablename__ = "audit_events"
    # A project's events newest first, keyset-paged by id (core.access.audit.list_page).
    __table_args__ = (Index("ix_audit_events_project_id_id", "project_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    project_id: Mapped[str | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), default=None
    )
    actor: Mapped[str | None] = mapped_column(String(255), default=None)
    actor_kind: Mapped[str] = mapped_column(String(10))  # key | oidc | anonymous
    key_id: Mapped[str | None] = mapped_column(String(300), default=None)
    method: Mapped[str] = mapped_column(String(10))
    path: Mapped[str] = mapped_column(String(2000))
    operation: Mapped[str | None] = mapped_column(String(100), default=None)  # operationId
    target: Mapped[str | None] = mapped_column(String(200), default=None)
    status_code: Mapped[int] = mapped_column(SmallInteger)
    outcome: Mapped[str] = mapped_column(String(10))
    source: Mapped[str | None] = mapped_column(String(100), default=None)
    request_id: Mapped[str | None] = mapped_column(String(128), default=None)


class WebhookSubscription(Base):
    """A project's webhook endpoint (core/webhooks/subscriptions.py, docs/CONTRACTS.md section 6).

    `secrets` is a list so a secret can rotate: every listed secret signs each delivery (one
    `v1,` signature each) until it is removed, so a receiver can switch keys without a gap. The
    secrets are kept as is: HMAC signing needs them. `event_types` are exact types
    (`job.failed`) or prefixes ending in `*` (`job.*`, `*`). `alert_rules`: core.jobs.alerts
    rules whose `alert.*` events go to this subscription only (0012).
    """

    __tablename__ = "webhook_subscriptions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list[str]] = mapped_column(JsonType)
    # [{"id": "whs_...", "secret": "whsec_...", "created_at": iso}], newest last.
    secrets: Mapped[list[dict[str, Any]]] = mapped_column(JsonType)
    alert_rules: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(default=None)


class WebhookEvent(Base):
    """The outbox: one row per event, written in the transaction of the change it reports.

    `event_id` is the `webhook-id` header of every delivery of the event (receivers dedupe on
    it); `id` orders a project's events as they happened."""

    __tablename__ = "webhook_events"
    __table_args__ = (Index("ix_webhook_events_project_id_id", "project_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(40), unique=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(100))
    payload: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeliveryStatus(enum.StrEnum):
    """A delivery's states: `pending -> delivered | dead`; redeliver makes it `pending` again."""

    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class WebhookDelivery(Base):
    """One event to one subscription: sent by `core.webhooks.subscriptions.deliver_due` until a 2xx
    answer, or `dead` after the last retry of the backoff schedule."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("subscription_id", "event_id"),
        Index("ix_webhook_deliveries_status_next", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    subscription_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"), index=True
    )
    event_id: Mapped[int] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(20), default=DeliveryStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(default=utcnow)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_response_ms: Mapped[float | None] = mapped_column(Float, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)


class WebhookAttempt(Base):
    """The delivery log: one row per HTTP attempt (status code, response time, error)."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("ix_webhook_attempts_delivery_id_id", "delivery_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE")
    )
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    response_ms: Mapped[float | None] = mapped_column(Float, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class AlertState(Base):
    """An alert that fired for a job (core/jobs/alerts.py): one row per (subscription, job, kind)
    while its condition holds, so it fires once per condition, not at every step."""

    __tablename__ = "alert_states"

    subscription_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"), primary_key=True
    )
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(40), primary_key=True)
    fired_at: Mapped[datetime] = mapped_column(default=utcnow)


class Quota(Base):
    """Limits of one project on one pool (`pool` "*": on every pool together), and its
    fair-share weight there (core.scheduling.quotas; 0014_quotas). A None limit is no limit.

    `max_slots`: devices (GPUs, CPU slots) its active jobs hold at once; `max_running_jobs`:
    active jobs; `max_queued_jobs`: queued jobs (checked at submission, 429);
    `monthly_slot_hours`: slot-hours (GPU-hours) per calendar month (UTC), counted by
    `core.usage.accounting.slot_seconds`; `weight`: its share of the pool against other projects'.
    """

    __tablename__ = "quotas"

    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True
    )
    pool: Mapped[str] = mapped_column(String(100), primary_key=True)
    max_slots: Mapped[int | None] = mapped_column(Integer, default=None)
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    monthly_slot_hours: Mapped[float | None] = mapped_column(Float, default=None)
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- Identity and access (issue 14, migration 0015_identity) ---------------------------------
# Who may call a project: members (people, named by a subject such as an email) and service
# accounts (CI, platforms), each with a role; an API key belongs to one of them and its scopes
# narrow that role. Keys made before 0015 have no owner: their own `role` (admin) applies.


class ProjectMember(Base):
    """A person in a project with a role (`viewer` | `member` | `admin`)."""

    __tablename__ = "project_members"
    __table_args__ = (UniqueConstraint("project_id", "subject"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    subject: Mapped[str] = mapped_column(String(200))  # an email or an OIDC `sub`
    role: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ServiceAccount(Base):
    """A non-person caller (CI, a platform) with a role; disabling it stops all its keys."""

    __tablename__ = "service_accounts"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(default=None)


class SweepState(enum.StrEnum):
    """A sweep's states (core/sweeps/drive.py moves them)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"  # every trial ended and at least one completed
    FAILED = "failed"  # every trial ended and none completed, or the study could not go on
    CANCELLED = "cancelled"


class TrialState(enum.StrEnum):
    """A sweep trial's states: its job's, plus `pruned` (stopped by the pruner) and `failed`
    for a sampled spec that did not validate (no job)."""

    RUNNING = "running"  # its job is queued or training
    SUCCEEDED = "succeeded"
    PRUNED = "pruned"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Sweep(Base):
    """A hyperparameter sweep (0019): `spec` is the `jobspec.sweep.SweepSpec` as submitted (its
    `base` with `init_from` pinned); the study behind it is Optuna's, named `study_name`, in
    Optuna's own tables (schema `optuna` on Postgres, `<db>-optuna.db` beside SQLite)."""

    __tablename__ = "sweeps"
    __table_args__ = (
        Index("ix_sweeps_project_id_id", "project_id", "id"),
        Index("ix_sweeps_state", "state"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(20), default=SweepState.RUNNING)
    spec: Mapped[dict[str, Any]] = mapped_column(JsonType)
    study_name: Mapped[str] = mapped_column(String(100))
    owner: Mapped[str | None] = mapped_column(String(100), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # The best completed trial so far (by `spec.metric` and `spec.direction`) and its value.
    best_trial: Mapped[int | None] = mapped_column(Integer, default=None)
    best_value: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class SweepTrial(Base):
    """One trial of a sweep: Optuna's trial `optuna_trial_id`, numbered from 0 in the sweep,
    run as job `job_id` (None when its sampled spec did not validate: `error` says why)."""

    __tablename__ = "sweep_trials"

    sweep_id: Mapped[int] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    optuna_trial_id: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), default=None, index=True
    )
    state: Mapped[str] = mapped_column(String(20), default=TrialState.RUNNING)
    params: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    value: Mapped[float | None] = mapped_column(Float, default=None)  # the metric's last value
    # Where the pruner stopped it: the reported step, and the ASHA rung (None for median).
    pruned_step: Mapped[int | None] = mapped_column(Integer, default=None)
    pruned_rung: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class SessionState(enum.StrEnum):
    """A training session's states (core/sessions/service.py moves them)."""

    ACTIVE = "active"  # its client heartbeats
    ENDED = "ended"  # idle past `session_idle_timeout_s` (`ended_reason` says so); final


class TrainingSession(Base):
    """A training session of the Tinker-compatible API (0025, issue 47): one client's
    `ServiceClient`, created by `POST /tinker/api/v1/create_session` and kept by its heartbeats.
    `tags`, `user_metadata`, `display_name` and `sdk_version` are the client's, as it sent them;
    `request_key` its `X-Idempotency-Key`, so a create it retried makes one session."""

    __tablename__ = "training_sessions"
    __table_args__ = (
        Index("ix_training_sessions_project_id_created_at", "project_id", "created_at"),
        Index("ix_training_sessions_state_last_heartbeat_at", "state", "last_heartbeat_at"),
        UniqueConstraint("project_id", "request_key", name="uq_training_sessions_request_key"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    owner: Mapped[str | None] = mapped_column(String(255), default=None)  # the caller's actor
    state: Mapped[str] = mapped_column(String(20), default=SessionState.ACTIVE)
    tags: Mapped[list[str]] = mapped_column(JsonType, default=list)
    user_metadata: Mapped[dict[str, Any]] = mapped_column(JsonType, default=dict)
    display_name: Mapped[str | None] = mapped_column(String(200), default=None)
    sdk_version: Mapped[str] = mapped_column(String(40))
    request_key: Mapped[str | None] = mapped_column(String(200), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    ended_reason: Mapped[str | None] = mapped_column(Text, default=None)


class SessionModel(Base):
    """A training client of a session (0026, issue 47): `id` is the client's `model_id`,
    `<session_id>:train:<model_seq_id>` (the client builds it itself for create-via-load), its
    registered base model and LoRA rank, and the session job that serves it (`job_id`, made
    through the one door). A session has as many as its client made, each its own job."""

    __tablename__ = "session_models"
    __table_args__ = (UniqueConstraint("session_id", "model_seq_id", name="uq_session_models_seq"),)

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    session_id: Mapped[str] = mapped_column(
        ForeignKey("training_sessions.id", ondelete="CASCADE"), index=True
    )
    model_seq_id: Mapped[int] = mapped_column(Integer)
    base_model: Mapped[str] = mapped_column(String(200))
    lora_rank: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StateMark(Base):
    """What was decided about a training client's named state after it was saved (0027, issue
    47): deleted (`delete_checkpoint`) or given an expiry (`set_checkpoint_ttl`). A deleted or
    expired state is neither listed nor loadable; its bytes stay with the session job's
    checkpoints (a preempted job may resume from them) and go with the job's own retention.
    Published (`publish_checkpoint`, 0028): other projects may read and load it too."""

    __tablename__ = "state_marks"

    model_id: Mapped[str] = mapped_column(
        ForeignKey("session_models.id", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    published_at: Mapped[datetime | None] = mapped_column(default=None)


class RequestState(enum.StrEnum):
    QUEUED = "queued"  # stored, waiting for its turn (seq_id order) in the session job
    RUNNING = "running"  # handed to the session job's program
    DONE = "done"  # `result` holds the answer
    FAILED = "failed"  # `error` and `error_category` hold why


class SessionRequest(Base):
    """One call of a session's client (0026, issue 47), queued for its session job and kept
    with its answer so that a retried `retrieve_future` gets the same one: `kind` is the route
    (`create_model`, `forward_backward`, ...), `body` the request as it came (JSON, or
    `forward_backward`'s protobuf), `seq_id` its place in its model's order. `result` is the
    answer's bytes, of `result_type` (`application/json` or `application/x-protobuf`); a failed
    call keeps `error` and `error_category` (`user`, `server`, Tinker's). `request_key` is the
    client's `X-Idempotency-Key`: a retried submission finds its first request."""

    __tablename__ = "session_requests"
    __table_args__ = (
        Index("ix_session_requests_model_state_seq", "model_id", "state", "seq_id"),
        UniqueConstraint("project_id", "request_key", name="uq_session_requests_request_key"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    session_id: Mapped[str] = mapped_column(
        ForeignKey("training_sessions.id", ondelete="CASCADE"), index=True
    )
    model_id: Mapped[str | None] = mapped_column(String(80), default=None)
    seq_id: Mapped[int | None] = mapped_column(Integer, default=None)
    kind: Mapped[str] = mapped_column(String(40))
    body: Mapped[bytes] = mapped_column(LargeBinary)
    body_type: Mapped[str] = mapped_column(String(60), default="application/json")
    request_key: Mapped[str | None] = mapped_column(String(200), default=None)
    state: Mapped[str] = mapped_column(String(20), default=RequestState.QUEUED)
    result: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    result_type: Mapped[str | None] = mapped_column(String(60), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    error_category: Mapped[str | None] = mapped_column(String(20), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    done_at: Mapped[datetime | None] = mapped_column(default=None)
