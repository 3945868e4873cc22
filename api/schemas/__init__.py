"""Request and response bodies of the REST API (docs/CONTRACTS.md, section 4): jobs, datasets,
metrics and the shared field types here; access (projects, members, service accounts, keys),
audit, code archives, quotas, usage and webhooks in the modules of this package.

One module of ~650 lines, on purpose: the job, dataset and metric bodies and the field types every
sibling module of this package reuses; each other resource has its own module here.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    Strict,
    StringConstraints,
    model_validator,
)

from api import openapi_examples
from api.validation import JsonInt
from core.attempts.retry_budget import RetryPolicy, retry_policy
from core.datasets.stats import DatasetStats
from core.jobs import runtime
from core.platform import tables
from core.platform.tables import JobState, aware
from dataformat.records import Format
from jobspec.job import AnyJobSpec, DataSpec, FailureClass, ModelSpec

# Letters, digits and printable punctuation; no control characters (Postgres refuses NUL).
PRINTABLE = r"^[^\x00-\x1f\x7f]+$"


# SQLite hands back naive datetimes; every timestamp the API sends is UTC with its offset.
Timestamp = Annotated[datetime, AfterValidator(aware)]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class Failure(BaseModel):
    """How the job's latest failed attempt failed: its class, why, where, and the failing rank's
    last log lines."""

    failure_class: FailureClass = Field(
        # The `failure` column (core.attempts.lifecycle_policy.Failure.to_json) names it `class`.
        validation_alias=AliasChoices("class", "failure_class"),
        description="`oom` (CUDA or host), `hang`, `node_lost`, `user_error` (spec, data or "
        "code exception), `infra` (collective timeout, disk full, storage unreachable) or "
        "`preempted`.",
    )
    reason: str = Field(description="One line: what went wrong.")
    rank: int | None = Field(default=None, description="The global rank that failed first.")
    node_rank: int | None = Field(default=None, description="The node (0-based) it ran on.")
    host: str | None = Field(default=None, description="The host of that node.")
    exit_code: int | None = Field(default=None, description="The failing rank's exit code.")
    log_tail: list[str] | None = Field(
        default=None,
        description="The failing rank's last log lines, oldest first. Null in the jobs list "
        "(`GET /v1/jobs`), which leaves them out to stay light; read the job for them.",
    )
    hints: list[str] = Field(
        default_factory=list,
        description="What the platform noticed that may explain the failure, one line each "
        "(e.g. a command argument naming a host path the job's sandbox does not show: declare "
        "it in `entrypoint.inputs`).",
    )


class JobUsage(_Out):
    """What a job used so far, every attempt together; a running node counts up to now."""

    slot_seconds: float = Field(
        description="Slots (GPUs, or CPU slots) x seconds held, summed over every node of "
        "every attempt."
    )
    cpu_seconds: float = Field(
        description="CPU time (user + system) of the job's trainer processes, as its workers "
        "measured it, in seconds."
    )
    cost: float = Field(
        description="slot-hours x the pool's price (`TORCHYARD_SLOT_PRICES`), in the server's "
        "currency (`GET /v1/usage` names it); 0 on a pool without a price."
    )


class JobQueue(BaseModel):
    """Why a job waits and when it may start (core/scheduling/queue_forecast.py)."""

    position: int | None = Field(
        description="1-based place in its pool's queue in claim order (quotas, then fair share "
        "between projects by active slots per weight, then priority, then age); null when the "
        "job is not queued (a gang assembling, paused).",
        examples=[3],
    )
    reason: str = Field(
        description="Why it waits: `no free worker`, `claimable now`, `quota gpus 2/2` (slots "
        "held/limit), `quota running jobs 3/3`, `budget exhausted`, `behind priority 50` (the "
        "highest priority ahead of it), `gang assembling 1/2` (nodes joined/needed), `paused`.",
        examples=["quota gpus 2/2"],
    )
    estimated_start_at: Timestamp | None = Field(
        description="When it may start, replaying the claim order over the pool's live workers "
        "and the running jobs' ETAs (average step time x steps left); null when that depends on "
        "something unknown (a running job's ETA, a monthly budget, no worker). UTC, ISO 8601.",
        examples=["2026-11-25T12:30:00Z"],
    )


class Job(_Out):
    """A training job. `spec` is the submitted JobSpec (or ScriptJobSpec, with `entrypoint`);
    `latest_metrics` the last value of each series; `current_step` the last step reported;
    `max_steps` the trainer's `train.max_steps` (0 for a script job: unknown)."""

    model_config = openapi_examples.config(openapi_examples.JOB)

    id: int = Field(description="The job's id.")
    project_id: str = Field(description="The project that owns the job.")
    name: str = Field(description="The spec's `name`.")
    state: JobState = Field(description="Lifecycle state (docs/CONTRACTS.md section 2).")
    attempt: int = Field(
        description="Attempt number: 1 for the first run, +1 per restart or retry."
    )
    labels: dict[str, str] = Field(
        description="Free-form key/value tags: the spec's `labels`, or the set last given to "
        "`PATCH /v1/jobs/{id}`."
    )
    pool: str = Field(description="The worker pool (queue) the job runs in.")
    # Not validated again: the row's spec is already a parsed JobSpec or ScriptJobSpec
    # (core.platform.tables.SpecType); its type still gives the schema and the serializer.
    spec: SkipValidation[AnyJobSpec] = Field(
        description="The submitted spec with every default filled in: a JobSpec, or a "
        "ScriptJobSpec for a job with `entrypoint`."
    )
    created_at: Timestamp = Field(description="When it was submitted; UTC, ISO 8601.")
    updated_at: Timestamp = Field(description="When its row last changed; UTC, ISO 8601.")
    started_at: Timestamp | None = Field(
        description="When its current attempt started running; null before."
    )
    finished_at: Timestamp | None = Field(
        description="When it reached a terminal state; null before."
    )
    current_step: int | None = Field(
        description="The last training step reported; null before the first."
    )
    max_steps: int = Field(
        description="`train.max_steps` of the spec; 0 for a script job (unknown)."
    )
    latest_metrics: dict[str, float | None] = Field(
        description="The last value of each metric series, by name; null where that value "
        "was not finite (NaN, +/-inf: JSON has no such numbers)."
    )
    exit_code: int | None = Field(
        description="The launcher's exit code once the attempt ended (torchrun's; a lone "
        "rank launched without torchrun: its own, -N for a death by signal N); else null."
    )
    error: str | None = Field(
        description="Why the job failed or was cancelled, in one line; for a `pruned` sweep "
        'trial, where its sweep\'s pruner stopped it ("pruned by sweep 3 at step 20, rung 1"); '
        "else null."
    )
    worker: str | None = Field(description="The worker running (or that last ran) the job.")
    heartbeat_at: Timestamp | None = Field(
        description="The worker's last heartbeat for this job; UTC, ISO 8601."
    )
    owner: str | None = Field(
        default=None, description="The name of the API key that submitted the job."
    )
    running_s: float | None = Field(
        default=None,
        description="Seconds the job has trained, every attempt together (pauses and restarts "
        "do not reset it; to now while an attempt runs); null before its first attempt.",
    )
    eta_s: float | None = Field(
        default=None,
        description="Seconds left for a running or paused job with a known `max_steps`, from the "
        "trainer's recent step time (else the run's average over all attempts); else null.",
    )
    queue_position: int | None = Field(
        default=None,
        description="Queued jobs only: 1-based place in its pool's queue, in claim order "
        "(`queue.position`); 1 runs on the next free worker. In the submit response (kept "
        "cheap): by priority and age only.",
    )
    queue: JobQueue | None = Field(
        default=None,
        description="Where a waiting job stands: queued jobs, a gang still assembling, paused "
        "jobs; null for the others, and in the submit response (read the job for it).",
    )
    waiting_for: str | None = Field(
        default=None,
        description="What a queued or paused job waits for, in words; for a starting job, what "
        'its worker prepares when that takes long ("fetching input corpus: 1.2 GB of 3.4 '
        'GB").',
    )
    failure: Failure | None = Field(
        default=None,
        description="The latest failed attempt (kept while a restart runs, cleared when the job "
        "succeeds or is retried by hand); null when none failed.",
    )
    restarts_used: int = Field(
        default=0,
        description="Restarts after failures, all classes, since submission or the last manual "
        "retry.",
    )
    restarts_by_class: dict[FailureClass, int] = Field(
        default_factory=dict, description="`restarts_used` per failure class."
    )
    retry_policy: RetryPolicy | None = Field(
        default=None,
        description="The spec's `retries` as budgets: per class allowed / used / left, the cap, "
        "and a summary of what the policy did.",
    )
    usage: JobUsage | None = Field(
        default=None,
        description="Slot-seconds, CPU-seconds and cost so far, every attempt together.",
    )
    note: str | None = Field(
        default=None,
        description="A free-text note about the job, set with `PATCH /v1/jobs/{id}`; null "
        "when none.",
    )
    best_loss: float | None = Field(
        default=None,
        description="The lowest finite `loss` reported so far (every attempt); null before "
        "the first.",
    )
    best_eval_loss: float | None = Field(
        default=None,
        description="The lowest finite `eval_loss` reported so far (every attempt); null "
        "before the first evaluation.",
    )
    spec_problems: list[str] = Field(
        default=[],
        description="What had to be repaired to read the stored spec (written by an older "
        "release, or by hand): each names a field and what was used instead. Empty for every "
        "job this release accepted; a job with problems needs attention: it is shown, "
        "followed and cancelled as any job, but never started.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_row(cls, data: Any) -> Any:
        """A `core.platform.tables.Job` row: its columns, and the retry budget computed from its
        spec."""
        if not isinstance(data, tables.Job):
            return data
        row = {name: getattr(data, name) for name in cls.model_fields if hasattr(data, name)}
        failure = data.failure or {}
        row["running_s"] = runtime.running_seconds(data)
        row["eta_s"] = runtime.eta_seconds(data)
        row["retry_policy"] = retry_policy(
            retries=data.spec.retries,
            restarts_used=data.restarts_used,
            restarts_by_class=data.restarts_by_class or {},
            state=data.state,
            failure_class=FailureClass(failure["class"]) if "class" in failure else None,
        )
        return row


class JobPage(BaseModel):
    model_config = openapi_examples.config(openapi_examples.JOB_PAGE)

    items: list[Job] = Field(description="Jobs, in the order the `sort` query parameter asks.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: last.")


class Event(_Out):
    """Something that happened to a job: a state change, a checkpoint, the sample, info, error."""

    model_config = openapi_examples.config(openapi_examples.EVENT)

    id: int = Field(description="The event's id (ascending in time).")
    job_id: int = Field(description="The job it belongs to.")
    attempt: int = Field(description="The attempt it happened in.")
    kind: str = Field(
        description="`state` | `checkpoint` | `sample` | `info` | `warning` | `error` | `hang` | "
        "`straggler`"
    )
    state_from: str | None = Field(description="`state` events: the state left; else null.")
    state_to: str | None = Field(description="`state` events: the state entered; else null.")
    message: str = Field(description="What happened, in words.")
    data: dict[str, Any] = Field(description="Structured details; keys depend on `kind`.")
    created_at: Timestamp = Field(description="When it happened; UTC, ISO 8601.")


class EventPage(BaseModel):
    model_config = openapi_examples.config(openapi_examples.EVENT_PAGE)

    items: list[Event] = Field(description="Events, oldest first.")
    next_cursor: str | None = Field(
        description="Pass as `after` for the next page; null when this page was the last."
    )


class LogLine(_Out):
    """A line one rank of the job printed; rank -1 is the launcher (worker)."""

    model_config = openapi_examples.config(openapi_examples.LOG_LINE)

    id: int = Field(description="The line's id (ascending in time).")
    attempt: int = Field(description="The attempt that printed it.")
    rank: int = Field(description="The global rank that printed it; -1 is the launcher.")
    stream: str = Field(description="`stdout` | `stderr` | `stacks` (the hang watchdog's dumps)")
    line: str = Field(description="The text, without its newline.")
    created_at: Timestamp = Field(description="When it was stored; UTC, ISO 8601.")


class LogPage(BaseModel):
    model_config = openapi_examples.config(openapi_examples.LOG_PAGE)

    items: list[LogLine] = Field(description="Log lines, oldest first.")
    next_cursor: str | None = Field(
        description="Pass as `after` for the next page; null when this page was the last."
    )


class _Floats(BaseModel):
    # A diverged run can report NaN or inf: sent as "NaN" / "Infinity", which parse as floats.
    model_config = ConfigDict(ser_json_inf_nan="strings")


class MetricLast(_Floats):
    step: int = Field(description="The step of the series' last point.")
    value: float = Field(description="Its value (NaN and infinities are sent as strings).")


class MetricSeries(_Floats):
    """One metric: `steps[i]` pairs with `values[i]`, ascending by step."""

    name: str = Field(description="The metric's name, such as `loss` or `lr`.")
    steps: list[int] = Field(description="Training steps, ascending.")
    values: list[float] = Field(description="The value at each step; NaN/inf are sent as strings.")
    last: MetricLast | None = Field(description="The last point; null for an empty series.")
    times: list[float] | None = Field(
        default=None,
        description="With `times=true`: the trainer's clock (unix seconds) when it reported "
        "`steps[i]`; absent otherwise.",
    )


class Metrics(BaseModel):
    model_config = openapi_examples.config(openapi_examples.METRICS)

    series: list[MetricSeries] = Field(description="One entry per metric, by name.")


# Where a file the API describes is on the server (`core.platform.server_paths`): admins only.
ServerUri = Annotated[
    str | None,
    Field(
        description="Its full server-side location (path or fsspec URI); only for callers with "
        "the `admin` permission, else null."
    ),
]


class CheckpointExport(_Out):
    """A consolidated safetensors export of one checkpoint: `pending -> running -> ready |
    failed`. Once ready, `GET .../export/download` serves its `model.safetensors`."""

    model_config = openapi_examples.config(openapi_examples.CHECKPOINT_EXPORT)

    id: int = Field(description="The export's id.")
    job_id: int = Field(description="The job whose checkpoint it exports.")
    checkpoint_id: int = Field(description="The checkpoint it exports.")
    step: int = Field(description="The checkpoint's training step.")
    state: Literal["pending", "running", "ready", "failed"] = Field(
        description="`pending` -> `running` -> `ready` or `failed`."
    )
    uri: str = Field(
        description="Its directory (`model.safetensors` and `config.json`), relative to the "
        "server's storage: `jobs/<job id>/exports/step_<step>`."
    )
    server_uri: ServerUri = None
    size_bytes: int | None = Field(description="Size of `model.safetensors` in bytes (ready).")
    sha256: str | None = Field(description="Hex sha256 of `model.safetensors` (ready).")
    error: str | None = Field(description="Why it failed (the end of the exporter's stderr).")
    queue_position: int | None = Field(
        default=None,
        description="A pending export's 1-based place in the export queue (served by "
        "`torchyard exporter`, oldest first); null once an exporter took it, and in lists.",
    )
    waiting_for: str | None = Field(
        default=None,
        description="Why a pending export does not start (`no exporter is running (start one: "
        "torchyard exporter)`); null when an exporter serves the export queue or it is not "
        "pending.",
    )
    created_at: Timestamp = Field(description="When it was requested; UTC, ISO 8601.")
    started_at: Timestamp | None = Field(description="When the exporter started; null before.")
    finished_at: Timestamp | None = Field(
        description="When it became ready or failed; null before."
    )


class Checkpoint(_Out):
    """A complete checkpoint; `uri` is its `step_XXXXXXXX` directory, relative to the server's
    storage."""

    id: int = Field(description="The checkpoint's id.")
    job_id: int = Field(description="The job that wrote it.")
    attempt: int = Field(description="The attempt that wrote it.")
    step: int = Field(description="The training step it holds.")
    uri: str = Field(
        description="Its `step_XXXXXXXX` directory, relative to the server's storage "
        "(`jobs/<job id>/checkpoints/step_XXXXXXXX`)."
    )
    server_uri: ServerUri = None
    size_bytes: int = Field(description="Its files' sizes added up, in bytes.")
    created_at: Timestamp = Field(description="When it was complete; UTC, ISO 8601.")
    export: CheckpointExport | None = Field(
        default=None, description="Its safetensors export, once one was requested."
    )


class CheckpointList(BaseModel):
    model_config = openapi_examples.config(openapi_examples.CHECKPOINT_LIST)

    items: list[Checkpoint] = Field(description="Complete checkpoints, by ascending step.")


class Evaluation(_Out):
    """One evaluation an eval job ran on a checkpoint (`jobspec.evaluate`): its scores and,
    for `generate`, its answers beside their prompts and references."""

    id: int = Field(description="The result's id.")
    job_id: int = Field(description="The eval job that ran it.")
    source_job_id: int = Field(description="The job whose checkpoint it evaluated.")
    checkpoint_id: int | None = Field(
        description="The checkpoint it evaluated (it may since have been deleted by retention)."
    )
    step: int = Field(
        description="That checkpoint's training step; 0 for the starting weights (`checkpoint_id` "
        "null: `evaluate.source.initial`)."
    )
    attempt: int = Field(description="The eval job's attempt that wrote it.")
    name: str = Field(description="The evaluation's name; its metrics are `<name>.<metric>`.")
    kind: str = Field(description="`perplexity`, `generate`, `lm_eval` or `reward`.")
    dataset: str | None = Field(
        description="The dataset it read; null: the source job's own evaluation split."
    )
    metrics: dict[str, float] = Field(
        description="`perplexity`: `loss` (nats per supervised token), `perplexity`, `tokens`, "
        "`rows`. `generate`: `exact_match` (0-1), `chrf` (0-100), `rouge_l` (F1, 0-1), "
        "`answers`. `lm_eval`: `<task>/<metric>` as lm-eval reports them (`pick/acc`; a filter "
        "other than `none` as `<metric>@<filter>`), stderrs, and `<task>/samples`. `reward`: "
        "`reward` (mean weighted reward of the completions), `reward_std`, `completion_length` "
        "(tokens), `answers`, and per grader `reward/<grader>`, `grader_errors/<grader>`, "
        "`grader_timeouts/<grader>`."
    )
    samples: list[dict[str, Any]] = Field(
        description="`generate`: each record's `prompt`, `reference`, `answer` and its own "
        "`exact_match`, `chrf`, `rouge_l`. `reward`: each completion's `prompt`, `completion`, "
        "`reward` (null when no grader scored it) and `scores` ({grader: score}). Empty for "
        "`perplexity`."
    )
    created_at: Timestamp = Field(description="When it was recorded; UTC, ISO 8601.")


class EvaluationList(BaseModel):
    model_config = openapi_examples.config(openapi_examples.EVALUATION_LIST)

    items: list[Evaluation] = Field(
        description="The evaluations of the job: the ones it ran (an eval job) and the ones "
        "run on its checkpoints (a training job), by checkpoint step."
    )


class NotTextFile(BaseModel):
    """A file of a directory left out as not UTF-8 text."""

    path: str = Field(description="Its path relative to the dataset's location.")
    size_bytes: int = Field(description="Its size in bytes.")
    reason: str = Field(
        description="Where and why it stops being text (`byte 9 (line 2) is a NUL byte ...`)."
    )


class LeftOut(BaseModel):
    """What a directory's text left out: binary files (their first MiB is not UTF-8 text),
    counted over every selected file, the first few named; and the text files a job reads
    without their stray bytes."""

    files: int = Field(description="Selected files that are not UTF-8 text.")
    bytes: int = Field(description="Their bytes.")
    of_files: int = Field(description="Files the filter selects.")
    of_bytes: int = Field(description="Their bytes.")
    examples: list[NotTextFile] = Field(description="The first 20 left out, in path order.")
    repaired_files: int = Field(
        default=0,
        description="Text files (their first MiB is text) holding stray NUL or non-UTF-8 bytes "
        "further on: a job reads them without those bytes.",
    )
    repaired: list[NotTextFile] = Field(
        default=[], description="The first 20 of them, each with its first stray byte."
    )


class Dataset(_Out):
    """Training data in a project: a registered server-side path or an uploaded file, its
    `format` (declared or detected) and, for record and token formats, its `stats`."""

    model_config = openapi_examples.config(openapi_examples.DATASET)

    id: str = Field(description="The dataset's id.")
    project_id: str = Field(description="The project that owns it.")
    name: str = Field(description="Unique in the project.")
    uri: str = Field(
        description="Where its bytes are, without the server's own directories: an upload's "
        "place in the server's storage (`datasets/<id>/<file name>`), or the path it was "
        "registered with."
    )
    server_uri: ServerUri = None
    size_bytes: int = Field(description="Its size in bytes (all files of a directory).")
    sha256: str = Field(description="Hex sha256 of its bytes.")
    num_files: int = Field(description="1 for a file; the file count of a directory.")
    format: Format = Field(description="How it is read: declared at registration or detected.")
    stats: DatasetStats | None = Field(
        description="What validation learned (record and token formats); else null."
    )
    include: list[str] | None = Field(
        default=None,
        description="A directory's files: glob patterns it was registered with, filled into "
        "the `data.include` of every job on it (a job that sets its own replaces them). Null "
        "for a file, and for a directory registered before filters were kept.",
    )
    exclude: list[str] | None = Field(
        default=None,
        description="A directory's `fnmatch` patterns of files not part of it; a job's "
        "`data.exclude` adds to them.",
    )
    left_out: LeftOut | None = Field(
        default=None,
        description="The selected files of a directory that are binary (their first MiB is not "
        "UTF-8 text: NUL bytes, bytes that do not decode): never read by a job. Null for a "
        "file (one that is not text is refused).",
    )
    created_at: Timestamp = Field(description="When it was registered or uploaded; UTC, ISO 8601.")


class DatasetList(BaseModel):
    model_config = openapi_examples.config(openapi_examples.DATASET_LIST)

    items: list[Dataset] = Field(description="The project's datasets, oldest first.")


class DatasetFile(BaseModel):
    """One file of a dataset."""

    path: str = Field(description="Its path relative to the dataset's location.")
    size_bytes: int = Field(description="Its size in bytes.")


class DatasetFilePage(BaseModel):
    """A page of a dataset's files, in path order."""

    model_config = openapi_examples.config(openapi_examples.DATASET_FILES)

    items: list[DatasetFile] = Field(description="The files, in relative-path order.")
    next_cursor: str | None = Field(
        description="`cursor` of the next page (the last path of this one); null at the end."
    )


class DatasetSampleItem(BaseModel):
    """One record of a sample."""

    where: str = Field(
        description="`file:line` (JSONL), `file:row` (Parquet), a text file's path, or "
        "`file:0` (a flat token array)."
    )
    record: Any = Field(
        description="The record as a job reads it: a JSON object, the head of a text file, or "
        "the first token ids."
    )
    truncated: bool = Field(
        description="A value was cut: strings to 2,000 characters, lists to 64 items."
    )


class DatasetSample(BaseModel):
    """The first records of a dataset, as a job reads them."""

    model_config = openapi_examples.config(openapi_examples.DATASET_SAMPLE)

    dataset_id: str = Field(description="The dataset sampled.")
    format: Format = Field(description="The dataset's format.")
    items: list[DatasetSampleItem] = Field(description="Its first records, in order.")


FilePattern = Annotated[str, StringConstraints(min_length=1, max_length=500, pattern=PRINTABLE)]
DatasetName = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=PRINTABLE, description="Unique in the project."),
]


TokenDtype = Literal["uint16", "uint32"]


class DatasetUploadForm(BaseModel):
    """The text fields of `POST /v1/datasets/upload`, beside its one `file` part: the form's
    OpenAPI schema is this model's (api.uploads.form_body), and the form is validated by it."""

    model_config = ConfigDict(extra="forbid")

    name: DatasetName = Field(description="The dataset's name, unique in the project.")
    format: Format | None = Field(
        default=None, description="Declared format; detected when absent."
    )
    token_dtype: TokenDtype | None = Field(
        default=None, description="`tokens` in a `.bin` file (default uint16)."
    )


class DatasetRegister(BaseModel):
    """A server-side file or directory to register as a dataset."""

    model_config = openapi_examples.config(openapi_examples.DATASET_REGISTER, extra="forbid")

    name: DatasetName
    uri: str = Field(
        min_length=1,
        max_length=4096,
        pattern=PRINTABLE,
        description="A path under one of the server's allowed data roots, or an object or "
        "prefix in an object store under a data root that is a URI (`s3://corpora/stdlib`).",
    )
    format: Format | None = Field(
        default=None,
        description="How to read and check the file; detected (from its type and first "
        "records) when absent. A directory is `text`.",
    )
    token_dtype: TokenDtype | None = Field(
        default=None, description="`tokens` in a `.bin` file: uint16 (default) or uint32."
    )
    include: list[FilePattern] | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description='A directory\'s files: glob patterns relative to it (default `["**/*"]`). '
        "Kept with the dataset: every job on it reads only these files.",
    )
    exclude: list[FilePattern] | None = Field(
        default=None,
        max_length=100,
        description="`fnmatch` patterns of a directory's files that are not part of it, matched "
        "against the path relative to it (default: a job's default `data.exclude`: installed "
        "packages, byte-code caches, `.git`).",
    )


class SpecCheck(BaseModel):
    """A spec text that `POST /v1/jobs` would accept: the document as written (send it as the
    JSON body) and the 1-based line of each field, by JSON Pointer (RFC 6901, "" = root)."""

    model_config = openapi_examples.config(openapi_examples.SPEC_CHECK)

    spec: dict[str, Any] = Field(
        description="The document as written; send it as the JSON body of `POST /v1/jobs`."
    )
    lines: dict[str, int] = Field(
        description='The 1-based line of each field, by JSON Pointer ("" = root).'
    )


class ProjectRef(BaseModel):
    id: str = Field(description="The project's id.")
    name: str = Field(description="The project's name.")


class KeyRef(BaseModel):
    id: str = Field(description="The API key's id.")
    name: str = Field(description="The key's name.")
    prefix: str = Field(
        description="The key's first characters, to tell keys apart (not a secret)."
    )


class Me(BaseModel):
    model_config = openapi_examples.config(openapi_examples.ME)

    project: ProjectRef = Field(description="The project the key belongs to.")
    key: KeyRef = Field(description="The key used.")
    role: Literal["viewer", "member", "admin"] = Field(
        default="admin", description="The caller's role in the project now (its key's owner's)."
    )
    scopes: list[str] = Field(
        default_factory=list, description="The key's scopes; a request needs role and scope."
    )
    org_admin: bool = Field(default=False, description="True for an organisation admin key.")


class Status(BaseModel):
    model_config = openapi_examples.config(openapi_examples.STATUS)

    status: Literal["ok"] = Field(default="ok", description="Always `ok` when the answer is 200.")


class ReconcilerStatus(BaseModel):
    """When the reconcile loop (the controller, `torchyard controller`) last ran."""

    state: Literal["ok", "stale", "absent"] = Field(
        description="`ok`: a reconcile finished within the last 10 s (five rounds); `stale`: "
        "the last one is older (lost workers' jobs are not requeued, hangs not ended); "
        "`absent`: no controller ever reconciled on this database."
    )
    reconciled_at: datetime | None = Field(
        description="When the last reconcile finished (the controller's clock); null when absent."
    )
    seconds_since: float | None = Field(
        description="Seconds since `reconciled_at` (the API's clock); null when absent."
    )
    leader: str | None = Field(
        description="The controller that ran the last reconcile, as `host:pid`; null when absent."
    )
    detail: str = Field(description="One sentence for people, with what to do when not `ok`.")


class Readiness(BaseModel):
    model_config = openapi_examples.config(openapi_examples.READINESS)

    status: Literal["ok", "degraded"] = Field(
        description="`ok`: the API is ready and the reconcile loop runs; `degraded`: the API "
        "serves (the answer is still 200) but `reconciler` is not `ok`."
    )
    reconciler: ReconcilerStatus = Field(description="The reconcile loop's last run.")


def _data_field(name: str) -> Any:
    """`DataSpec`'s declaration of `name` (default, bounds, description), to declare it again."""
    return copy.copy(DataSpec.model_fields[name])


class DatasetPreviewRequest(BaseModel):
    """How to tokenize a dataset's first records for a mask preview: the job spec's `model`
    section and the `data` fields that decide the loss mask."""

    model_config = openapi_examples.config(openapi_examples.DATASET_PREVIEW_REQUEST, extra="forbid")

    model: ModelSpec = Field(
        default_factory=ModelSpec,
        description="The job spec's `model` section: its tokenizer (bytes for `gpt`; for `hf`, "
        "the one saved in `hf.path_or_id`, a server-side path) and its `seq_len`.",
    )
    chat_template: str | None = _data_field("chat_template")
    loss_on: Literal["assistant", "completion", "all"] | None = _data_field("loss_on")
    seq_len: Annotated[int, Field(ge=8, le=65536), JsonInt] | None = Field(
        default=None, description="Context length in tokens; null: model.seq_len."
    )
    truncation: Literal["drop", "truncate_left", "truncate_right"] = _data_field("truncation")
    max_truncated_share: Annotated[float, Strict()] = _data_field("max_truncated_share")
    num_examples: Annotated[int, Field(ge=1, le=64), JsonInt] = Field(
        default=8, description="How many records, from the first, to preview."
    )


class PreviewExample(BaseModel):
    """One record as the job tokenizes it; the lists have one entry per token (L)."""

    where: str = Field(description="`file:line` (or `file:row`) of the record.")
    status: Literal["kept", "truncated", "dropped"] = Field(
        description="What `truncation` does with it at `seq_len`."
    )
    num_tokens: int = Field(description="The example's length L in tokens (before truncation).")
    input_ids: list[int] = Field(description="Its first min(L, 4096) token ids.")
    tokens: list[str] = Field(description="Each token decoded alone (display text).")
    supervised: list[bool] = Field(description="Token t is a target of the loss (mask bit).")
    roles: list[str] = Field(description="The message role (or record part) token t is from.")


class PreviewReport(BaseModel):
    """The mask verifier's counts over the previewed examples (after truncation)."""

    examples: int = Field(description="Examples previewed.")
    dropped: int = Field(description="Examples `truncation` drops (longer than `seq_len`).")
    truncated: int = Field(description="Examples cut to `seq_len`.")
    lost_all_supervision: int = Field(description="Examples truncation left no target.")
    tokens: int = Field(description="Tokens over the kept examples.")
    supervised_tokens: int = Field(description="Of those, tokens that are loss targets.")
    supervised_share_by_role: dict[str, float] = Field(
        description="Each role's share of all supervised tokens (fractions summing to 1)."
    )
    tokens_by_role: dict[str, int] = Field(
        description="`tokens` per message role (or record part)."
    )
    supervised_by_role: dict[str, int] = Field(description="`supervised_tokens` per role.")


class DatasetPreview(BaseModel):
    """What a job would learn from the dataset's first records, and the verifier's verdict."""

    model_config = openapi_examples.config(openapi_examples.DATASET_PREVIEW)

    dataset_id: str = Field(description="The dataset previewed.")
    format: Format = Field(description="The dataset's format.")
    tokenizer: str = Field(description="`bytes`, or the tokenizer's class and path.")
    seq_len: int = Field(description="Context length in tokens used for the preview.")
    loss_on: Literal["assistant", "completion", "all"] = Field(
        description="Which tokens are loss targets."
    )
    verdict: Literal["ok", "refused"] = Field(
        description="`ok`, or `refused`: a job's mask verifier would refuse it."
    )
    refused: str | None = Field(
        description="The reason a job's mask verifier would refuse this sample, word for word."
    )
    examples: list[PreviewExample] = Field(
        description="The first records, as the job tokenizes them."
    )
    report: PreviewReport = Field(description="The verifier's counts over these examples.")


LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=PRINTABLE)]
LabelValue = Annotated[str, StringConstraints(max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")]
MAX_LABELS = 64
MAX_NOTE_CHARS = 10_000


class JobUpdate(BaseModel):
    """What `PATCH /v1/jobs/{id}` changes; a field left out (or null) stays as it is."""

    model_config = ConfigDict(extra="forbid")

    labels: dict[LabelKey, LabelValue] | None = Field(
        default=None,
        max_length=MAX_LABELS,
        description=f"The job's new labels, replacing the whole set (at most {MAX_LABELS}; "
        "keys 1-100 printable characters, values up to 200); `{}` removes them all.",
        examples=[{"team": "nlp", "baseline": "yes"}],
    )
    note: Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")] | None = Field(
        default=None,
        max_length=MAX_NOTE_CHARS,
        description=f"A free-text note (up to {MAX_NOTE_CHARS} characters, newlines allowed); "
        '`""` removes it.',
        examples=["lr 3e-4 diverged at step 900; retry with warmup"],
    )
