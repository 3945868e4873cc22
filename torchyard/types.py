"""Typed answers of the REST API (docs/CONTRACTS.md, section 4).

The models accept fields they do not know (``extra="allow"``) so an older client keeps working
against a newer server; every field the contract names is declared with its type.

One module of ~510 lines, on purpose: it mirrors the API's answers one class each, and a
reader looks a model up by name here rather than across files.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: States after which a job never changes again.
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "pruned"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Failure(_Model):
    """How a job's latest failed attempt failed. `failure_class`: ``oom``, ``hang``,
    ``node_lost``, ``user_error``, ``infra`` or ``preempted``; `rank` the global rank that
    failed first; `log_tail` its last log lines (None in a jobs list)."""

    failure_class: str
    reason: str
    rank: int | None = None
    node_rank: int | None = None
    host: str | None = None
    exit_code: int | None = None
    log_tail: list[str] | None = None
    hints: list[str] = Field(default_factory=list)


class ClassBudget(_Model):
    """Restarts after failures of one class: allowed, used, left (the cap included)."""

    allowed: int
    used: int
    left: int


class RetryPolicy(_Model):
    """The job's `retries` as budgets, and `summary`: what the policy did, in words."""

    cap: int
    used: int
    left: int
    by_class: dict[str, ClassBudget] = Field(default_factory=dict)
    summary: str = ""


class Entrypoint(_Model):
    """A script job's `entrypoint` (docs/CONTRACTS.md section 5): the code archive's id, the
    argv every rank runs, extra environment variables, packages installed for the job, and how
    many complete checkpoints to keep (None: all)."""

    code: str
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    requirements: list[str] = Field(default_factory=list)
    keep_last_checkpoints: int | None = None


class JobUsage(_Model):
    """What a job used so far: slot-seconds, CPU-seconds and cost (the server's currency)."""

    slot_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cost: float = 0.0


class JobQueue(_Model):
    """Where a waiting job stands: `position` in its pool's queue (1-based, claim order; None
    when not queued), `reason` it waits (``quota gpus 2/2``, ``no free worker``, ...), and
    `estimated_start_at` (None: unknown)."""

    position: int | None = None
    reason: str
    estimated_start_at: datetime | None = None


class EvalSource(_Model):
    """What an eval job scores (its spec's `evaluate.source`): a checkpoint of job `job`, pinned
    at submission (`checkpoint`: its id), or that job's starting weights (`initial`)."""

    job: int
    checkpoint: int | None = None
    initial: bool = False


class Job(_Model):
    """A training job as the API reports it. `spec` is the submitted spec as a dict: the
    built-in trainer's `JobSpec`, a `ScriptJobSpec` with `entrypoint` or an `EvalJobSpec` with
    `evaluate` (see `kind`); `failure`
    the latest failed attempt (None when none failed). `max_steps` is 0 or None when unknown
    (a script job's)."""

    id: int
    project_id: int | str | None = None
    name: str
    state: str
    attempt: int = 0
    labels: dict[str, str] = Field(default_factory=dict)
    pool: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    current_step: int | None = None
    max_steps: int | None = None
    latest_metrics: dict[str, float | None] = Field(default_factory=dict)  # null: NaN/inf
    exit_code: int | None = None
    error: str | None = None
    worker: str | None = None
    heartbeat_at: datetime | None = None
    owner: str | None = None  # the name of the API key that submitted it
    running_s: float | None = None  # trained seconds, all attempts (pauses do not reset it)
    eta_s: float | None = None  # seconds left at the recent step rate; None when unknown
    queue_position: int | None = None
    waiting_for: str | None = None
    failure: Failure | None = None
    restarts_used: int = 0
    restarts_by_class: dict[str, int] = Field(default_factory=dict)
    retry_policy: RetryPolicy | None = None
    usage: JobUsage | None = None
    queue: JobQueue | None = None  # a waiting job's place, reason and estimated start
    note: str | None = None  # free text, set with `client.jobs.update`
    best_loss: float | None = None  # the lowest finite `loss` reported
    best_eval_loss: float | None = None  # the lowest finite `eval_loss` reported

    @property
    def is_terminal(self) -> bool:
        """True once the job is succeeded, failed, cancelled or pruned."""
        return self.state in TERMINAL_STATES

    @property
    def kind(self) -> str:
        """``script`` for a job that runs the user's own code (`entrypoint`), ``eval`` for one
        that scores a checkpoint of another job (`evaluate`), else ``trainer`` (the built-in
        trainer)."""
        if "entrypoint" in self.spec:
            return "script"
        return "eval" if "evaluate" in self.spec else "trainer"

    @property
    def method(self) -> str:
        """The built-in trainer's `method.kind` (`sft`, `dpo`, `grpo`); `sft` when unset."""
        section = self.spec.get("method")
        kind = section.get("kind") if isinstance(section, dict) else None
        return kind if isinstance(kind, str) else "sft"

    @property
    def eval_source(self) -> EvalSource | None:
        """An eval job's source (job, checkpoint or starting weights); None for another kind."""
        section = self.spec.get("evaluate")
        if not isinstance(section, dict) or not isinstance(section.get("source"), dict):
            return None
        return EvalSource.model_validate(section["source"])

    @property
    def entrypoint(self) -> Entrypoint | None:
        """A script job's `entrypoint` section, typed; None for a trainer job."""
        section = self.spec.get("entrypoint")
        return None if section is None else Entrypoint.model_validate(section)


class Event(_Model):
    """One entry of a job's history: a state change, a checkpoint, the text sample, info or an
    error. `data` holds the kind's payload (e.g. ``prompt`` and ``text`` for ``sample``)."""

    id: int
    job_id: int
    attempt: int = 0
    kind: str
    state_from: str | None = None
    state_to: str | None = None
    message: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None


class LogLine(_Model):
    """One line a process of the job wrote. `rank` -1 is the launcher (worker) itself."""

    id: int
    attempt: int = 0
    rank: int
    stream: str = "stdout"
    line: str
    created_at: datetime | None = None


class CheckpointExport(_Model):
    """A checkpoint's consolidated safetensors export: `state` is ``pending``, ``running``,
    ``ready`` or ``failed``; once ready, `size_bytes` and `sha256` describe its
    ``model.safetensors`` (`client.exports.download` fetches it), and `error` says why a failed
    one failed. `uri` is its directory relative to the server's storage; `server_uri` the full
    location, for admin keys only."""

    id: int
    job_id: int
    checkpoint_id: int
    step: int
    state: str
    uri: str | None = None
    server_uri: str | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    error: str | None = None
    queue_position: int | None = None  # a pending export's place in the export queue
    waiting_for: str | None = None  # why a pending export does not start (no exporter runs)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def is_done(self) -> bool:
        """True once the export is ready or failed."""
        return self.state in ("ready", "failed")


class Evaluation(_Model):
    """One evaluation an eval job ran on a checkpoint of `source_job_id` at `step`: its
    `metrics` (`perplexity`: loss, perplexity, tokens, rows; `generate`: exact_match, chrf,
    rouge_l, answers; `reward`: reward, reward_std, reward/<grader>, ...) and its `samples`
    (`generate`: prompt, reference, answer, scores; `reward`: prompt, completion, reward,
    scores)."""

    id: int
    job_id: int
    source_job_id: int
    checkpoint_id: int | None = None
    step: int
    attempt: int = 0
    name: str
    kind: str
    dataset: str | None = None
    metrics: dict[str, float] = {}
    samples: list[dict[str, Any]] = []
    created_at: datetime | None = None


class Checkpoint(_Model):
    """A complete checkpoint: `uri` is its ``step_XXXXXXXX`` directory relative to the server's
    storage (`server_uri` the full location, for admin keys only), `size_bytes` in bytes;
    `export` its safetensors export, once one was asked for."""

    id: int
    job_id: int
    attempt: int = 0
    step: int
    uri: str
    server_uri: str | None = None
    size_bytes: int | None = None
    created_at: datetime | None = None
    export: CheckpointExport | None = None


DATASET_FORMATS = (
    "text",
    "jsonl_text",
    "messages",
    "prompt_completion",
    "preference",
    "tokens",
    "prompt",
)
"""The server's dataset formats (`dataformat.records.FORMATS`; a unit test keeps them equal)."""


class Lengths(_Model):
    """Length percentiles (nearest rank) and maximum: characters, or tokens for `tokens`."""

    p50: int
    p90: int
    p99: int
    max: int


class StatsWarning(_Model):
    """Something that did not refuse a dataset: `count` records, the first at `first`."""

    type: str
    message: str
    count: int
    first: str


class DatasetStats(_Model):
    """What the server's record-by-record check counted (docs/CONTRACTS.md, `Dataset`)."""

    records: int
    bytes: int
    roles: dict[str, int] = {}
    chars: dict[str, Lengths] | None = None
    tokens: Lengths | None = None
    num_tokens: int | None = None
    supervised_tokens: int | None = None
    max_token_id: int | None = None
    token_dtype: str | None = None
    duplicates: int = 0
    warnings: list[StatsWarning] = []


class NotTextFile(_Model):
    """A file of a directory dataset left out as not UTF-8 text."""

    path: str
    size_bytes: int
    reason: str


class LeftOut(_Model):
    """What a directory dataset left out as binary (its first MiB is not UTF-8 text): `files`
    of `of_files` selected, `bytes` of `of_bytes`, the first few in `examples`; a job never
    reads them. `repaired_files`: text files a job reads without their stray bytes."""

    files: int
    bytes: int
    of_files: int
    of_bytes: int
    examples: list[NotTextFile] = []
    repaired_files: int = 0
    repaired: list[NotTextFile] = []


class Dataset(_Model):
    """Training data registered in a project; `id` looks like ``ds_...``. `format` is one of
    text, jsonl_text, messages, prompt_completion, preference, tokens. `uri` is an upload's
    place in the server's storage (``datasets/<id>/<file>``) or the path it was registered
    with; `server_uri` the full location, for admin keys only. A directory's `include` /
    `exclude` are its files (every job on it reads only these); `left_out` the selected files
    that are not text."""

    id: str
    project_id: int | str | None = None
    name: str
    uri: str
    server_uri: str | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    num_files: int | None = None
    format: str = "text"
    stats: DatasetStats | None = None
    include: list[str] | None = None
    exclude: list[str] | None = None
    left_out: LeftOut | None = None
    created_at: datetime | None = None


class DatasetFile(_Model):
    """One file of a dataset: its path relative to the dataset's location, its size."""

    path: str
    size_bytes: int


class SampleRecord(_Model):
    """One record of `client.datasets.sample(...)`: `where` (``file:line``, ``file:row``, a
    text file's path, ``file:0`` for a token array), the record as a job reads it (a JSON
    object, a text head, token ids), and whether a long value was cut (`truncated`)."""

    where: str
    record: Any = None
    truncated: bool = False


class DatasetSample(_Model):
    """The first records of a dataset."""

    dataset_id: str
    format: str
    items: list[SampleRecord] = []


class PreviewExample(_Model):
    """One record as a job tokenizes it: per token (L of each) its id, display text, mask bit
    (a target of the loss) and the role it came from; `status`: kept, truncated or dropped."""

    where: str
    status: str
    num_tokens: int
    input_ids: list[int]
    tokens: list[str]
    supervised: list[bool]
    roles: list[str]


class PreviewReport(_Model):
    """The mask verifier's counts over the previewed examples (after truncation)."""

    examples: int
    dropped: int
    truncated: int
    lost_all_supervision: int
    tokens: int
    supervised_tokens: int
    supervised_share_by_role: dict[str, float] = {}
    tokens_by_role: dict[str, int] = {}
    supervised_by_role: dict[str, int] = {}


class DatasetPreview(_Model):
    """`client.datasets.preview(...)`: what a job would learn from the first records, and the
    verdict (`ok`, or `refused` with the reason a job would be refused with)."""

    dataset_id: str
    format: str
    tokenizer: str
    seq_len: int
    loss_on: str
    verdict: str
    refused: str | None = None
    examples: list[PreviewExample] = []
    report: PreviewReport


class MetricPoint(_Model):
    """One value of one metric at one optimizer step."""

    name: str
    step: int
    value: float


class MetricSeries(_Model):
    """All points of one metric, `steps[i]` paired with `values[i]`, ascending by step."""

    name: str
    steps: list[int] = Field(default_factory=list)
    values: list[float] = Field(default_factory=list)
    last: MetricPoint | None = None

    @model_validator(mode="before")
    @classmethod
    def _name_the_last_point(cls, data: Any) -> Any:
        """The API sends `last` as ``{"step", "value"}``; give it the series' name."""
        if isinstance(data, dict) and isinstance(data.get("last"), dict):
            data = {**data, "last": {"name": data.get("name", ""), **data["last"]}}
        return data

    def points(self) -> list[MetricPoint]:
        """The series as points, in step order."""
        return [
            MetricPoint(name=self.name, step=s, value=v)
            for s, v in zip(self.steps, self.values, strict=False)
        ]


class ProjectRef(_Model):
    id: int | str
    name: str


class KeyRef(_Model):
    id: int | str
    name: str | None = None
    prefix: str | None = None


class Me(_Model):
    """Who the API key belongs to."""

    project: ProjectRef
    key: KeyRef
    role: str = "admin"  # viewer | member | admin: the key owner's role now
    scopes: list[str] = Field(default_factory=list)  # what the key may do within that role
    org_admin: bool = False


T = TypeVar("T")


class Page(_Model, Generic[T]):
    """One page of a list answer; pass `next_cursor` back to get the next one (None: last)."""

    items: list[T] = Field(default_factory=list)
    next_cursor: str | int | None = None


class CodeArchive(_Model):
    """Training code uploaded for `entrypoint` jobs (``client.code.upload``); `id` looks like
    ``code_...`` and is what a spec's ``entrypoint.code`` names. `format`: ``tar.gz`` or
    ``zip``; `files` (relative paths, sorted) is absent from a list."""

    id: str
    name: str
    format: str
    sha256: str
    size_bytes: int
    unpacked_bytes: int
    num_files: int
    files: list[str] | None = None
    created_at: datetime | None = None


class Trial(_Model):
    """One trial of a sweep: the values it drew (`params`, by spec path), its state
    (``running``, ``succeeded``, ``pruned``, ``failed``, ``cancelled``), the metric's last value,
    its job, and where the pruner stopped it."""

    number: int
    state: str
    params: dict[str, Any] = Field(default_factory=dict)
    value: float | None = None
    job_id: int | None = None
    job_state: str | None = None
    current_step: int | None = None
    pruned_step: int | None = None
    pruned_rung: int | None = None
    error: str | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None


class BestTrial(_Model):
    """A sweep's best completed trial and its job's latest checkpoint (to export)."""

    number: int
    value: float
    params: dict[str, Any] = Field(default_factory=dict)
    job_id: int | None = None
    checkpoint_id: int | None = None
    checkpoint_step: int | None = None
    export_refused: str | None = None  # why `torchyard export` would refuse that checkpoint


class Sweep(_Model):
    """A hyperparameter sweep (``client.sweeps``): `state` is ``running``, ``succeeded``,
    ``failed`` or ``cancelled``; `trials` counts its trials by state; `spec` is the sweep spec
    as submitted."""

    id: int
    name: str
    state: str
    spec: dict[str, Any] = Field(default_factory=dict)
    owner: str | None = None
    error: str | None = None
    max_trials: int = 0
    trials: dict[str, int] = Field(default_factory=dict)
    best: BestTrial | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None


class SessionModel(_Model):
    """A training client of a session (``client.sessions``): its `model_id`, base model and
    LoRA rank, and the session job serving it with that job's state and optimizer steps."""

    model_id: str
    base_model: str
    lora_rank: int
    job_id: int
    job_state: str | None = None
    current_step: int | None = None


class TrainingSession(_Model):
    """A training session of the Tinker-compatible API (``client.sessions``): `state` is
    ``active`` while its client heartbeats, else ``ended`` (`ended_reason` says why); `models`
    are its training clients, `calls` its clients' calls by state."""

    id: str
    state: str
    display_name: str | None = None
    tags: list[str] = Field(default_factory=list)
    user_metadata: dict[str, Any] = Field(default_factory=dict)
    sdk_version: str = ""
    owner: str | None = None
    created_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    ended_at: datetime | None = None
    ended_reason: str | None = None
    models: list[SessionModel] = Field(default_factory=list)
    calls: dict[str, int] = Field(default_factory=dict)


class LoraFile(_Model):
    """One file of a LoRA export: its name and size in bytes."""

    name: str
    size_bytes: int


class LoraExport(_Model):
    """What a LoRA/QLoRA job wrote at its end (``client.exports.lora``): `kind` ``adapter``
    (a PEFT adapter directory) or ``merged`` (the base with the adapter merged in), the step,
    its directory relative to the server's storage, and its files."""

    job_id: int
    kind: str
    step: int
    uri: str
    server_uri: str | None = None
    files: list[LoraFile] = Field(default_factory=list)


class LoraExports(_Model):
    """A job's LoRA exports: each None until a LoRA/QLoRA run writes it at its end."""

    adapter: LoraExport | None = None
    merged: LoraExport | None = None
