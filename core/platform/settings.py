"""Settings from the environment (`TORCHYARD_*`), via pydantic-settings."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class SlurmPool(BaseModel):
    """A pool whose jobs Slurm places (`TORCHYARD_SLURM_POOLS`): the submitter
    (`python -m workers slurm --pool NAME`, on a login node) turns each claimed job into an
    `sbatch` script with these settings (`workers.slurm`)."""

    model_config = ConfigDict(extra="forbid")

    partition: str | None = Field(default=None, description="`--partition`; None: the default.")
    account: str | None = Field(default=None, description="`--account`.")
    qos: str | None = Field(default=None, description="`--qos`.")
    time_limit: str | None = Field(
        default=None,
        description="`--time` (Slurm's formats, e.g. `04:00:00`); None: the partition's.",
    )
    gpus: bool = Field(
        default=False,
        description="Devices are GPUs (`--gres=gpu:K`, K = `resources.procs_per_node`); else each "
        "rank gets a CPU (`--cpus-per-task=K`).",
    )
    memory_mb_per_slot: int | None = Field(
        default=None, ge=1, description="`--mem` per node = this x the node's slots (MiB)."
    )
    signal_s: int = Field(
        default=120,
        ge=1,
        description="`--signal=TERM@<s>`: seconds before the time limit when the node agents hand "
        "the job back (checkpointed) so it runs on in a new allocation.",
    )
    sbatch_args: list[str] = Field(
        default_factory=list, description="Further `sbatch` flags, one per item (`--exclusive`)."
    )
    poll_s: float = Field(
        default=2.0, gt=0, description="How often the submitter asks Slurm for its jobs' state."
    )


class BaseModelEntry(BaseModel):
    """A base model the OpenAI-compatible view offers (`TORCHYARD_BASE_MODELS`)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="A local Hugging Face directory under an allowed data root.")
    lora: dict[str, Any] | None = Field(
        default_factory=lambda: {"r": 8, "alpha": 16},
        description="The `lora` section of the jobs fine-tuning it; null: they train every "
        "weight (a small model a deployment lets teams fine-tune in full).",
    )
    seq_len: int = Field(default=512, ge=8, description="`model.seq_len` of its jobs (tokens).")
    learning_rate: float = Field(
        default=1e-3, gt=0, description="Peak lr that `learning_rate_multiplier` 1.0 gives."
    )
    n_epochs: int = Field(default=3, ge=1, description="What `n_epochs: auto` resolves to.")
    batch_size: int = Field(default=4, ge=1, description="What `batch_size: auto` resolves to.")
    pool: str = Field(default="default", description="The worker pool its jobs run on.")
    resources: dict[str, Any] = Field(
        default_factory=dict, description="The `resources` section (besides `pool`)."
    )
    spec: dict[str, Any] = Field(
        default_factory=dict,
        description="Further JobSpec sections merged into its jobs (`eval`, `checkpoint`, ...).",
    )
    grpo: dict[str, Any] = Field(
        default_factory=dict,
        description="`method.grpo` settings of its reinforcement jobs (`max_new_tokens`, "
        "`temperature`, `beta`, ...; `jobspec.method.GRPOSpec`); the request gives `graders` "
        "and `group_size`.",
    )


class OidcGrant(BaseModel):
    """What members of one identity-provider group get (`TORCHYARD_OIDC_GROUP_ROLES`)."""

    model_config = ConfigDict(extra="forbid")

    project: str = Field(description="The name of the project the group's members act in.")
    role: Literal["viewer", "member", "admin"] = Field(
        description="Their role in it (core.access.auth.Role); the highest of a caller's groups "
        "wins."
    )


# Asymmetric JWS algorithms an OIDC token may be signed with; `none` and the HMAC family (whose
# "secret" would be the public key anyone can fetch) never verify a token.
OIDC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


class Settings(BaseSettings):
    """Process-wide configuration. Build engines and apps from it in factories, not at import."""

    model_config = SettingsConfigDict(env_prefix="TORCHYARD_", extra="ignore")

    env: Literal["dev", "test", "production"] = Field(
        default="dev",
        description="`production` refuses unsafe defaults (SQLite, no-server broker).",
    )
    home: Path = Field(
        default=Path(".torchyard"), description="Local state for the embedded default."
    )
    database_url: str = Field(default="", description="SQLAlchemy URL; SQLite under home if empty.")
    database_direct_url: str = Field(
        default="",
        description="Postgres itself, when `database_url` is PgBouncer in transaction pooling: "
        "the controller leads by a session-level advisory lock, which a pooled connection "
        "would lose, and migrations run here too. Empty: `database_url` (read it as "
        "`direct_database_url`).",
    )
    broker_url: str = Field(
        default="filesystem://", description="Celery broker; `filesystem://` needs no server."
    )
    storage_url: str = Field(
        default="", description="Checkpoints, uploads and run dirs (local dir or fsspec URI)."
    )
    data_roots: list[str] = Field(
        default_factory=list,
        description="Server-side directories that `POST /v1/datasets` may register, besides the "
        "Python standard library and the storage root.",
    )
    fenced_destinations: list[str] = Field(
        default_factory=list,
        description="`host:port` destinations a job's processes may not connect to, besides the "
        "database, the broker and link-local addresses, which are always fenced (e.g. the API's "
        "admin listener, the object store's console): `workers.isolation.netfence`.",
    )
    max_upload_bytes: int = Field(default=512 * 1024**2, ge=1, description="Upload size limit.")
    code_max_bytes: int = Field(
        default=100 * 1024**2,
        ge=1,
        description="A code archive (`POST /v1/code`) over this many bytes is refused (413).",
    )
    code_max_unpacked_bytes: int = Field(
        default=1024**3,
        ge=1,
        description="A code archive whose files add up to more than this many bytes unpacked "
        "is refused (413), at upload and again when a worker unpacks it.",
    )
    max_record_bytes: int = Field(
        default=4 * 1024**2,
        ge=1,
        description="A dataset record (JSONL line, Parquet row as JSON) over this many bytes "
        "refuses the dataset.",
    )
    lm_eval_task_dirs: list[str] = Field(
        default_factory=list,
        description="Directories of lm-evaluation-harness task YAMLs whose data is local: the "
        "task names an eval job's `lm_eval` evaluation may use (the harness's own tasks read "
        "the Hugging Face hub, which workers do not reach). Indexed by lm-eval's TaskManager.",
    )
    base_models: dict[str, BaseModelEntry] = Field(
        default_factory=dict,
        description="JSON: name -> base model the OpenAI-compatible API (`/openai/v1`) fine-tunes.",
    )
    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="Worker heartbeat period.")
    heartbeat_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A running job whose own heartbeat (the supervise loop's) is older is "
        "reaped even if its worker process still beats: the fallback for a wedged loop.",
    )
    worker_heartbeat_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="How often each worker process writes its row in `workers` (a thread of its "
        "own, apart from any job).",
    )
    worker_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A worker whose row is older than this is gone: the reconciler requeues its "
        "jobs as `node_lost`. At least twice `worker_heartbeat_interval_s`.",
    )
    cancel_grace_s: float = Field(
        default=8.0, ge=0, description="SIGTERM-to-SIGKILL grace when cancelling a run."
    )
    ingest_interval_s: float = Field(
        default=0.5, gt=0, description="How often the worker flushes trainer output to the DB."
    )
    sys_metrics_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the worker samples a running job's CPU, memory and GPUs into its "
        "`sys/*` series and Prometheus gauges (seconds).",
    )
    worker_hostname: str = Field(default="", description="Name a worker records on claimed jobs.")
    input_cache_gb: float = Field(
        default=50.0,
        ge=0,
        description="Gigabytes of remote inputs (`entrypoint.inputs` on object storage) a worker "
        "host keeps in its cache (`<home>/cache/inputs`); beyond it the least recently used "
        "entries not in use are evicted (workers.inputs).",
    )
    worker_slots: int | None = Field(
        default=None,
        ge=1,
        description="Devices a worker hands out to jobs at once: CPU slots on a host without "
        "GPUs (default 1), or the first that many GPUs (default all NVML finds). A job's node "
        "takes `resources.procs_per_node` of them (workers.devices).",
    )
    export_queue: str = Field(
        default="exports",
        min_length=1,
        max_length=100,
        description="The queue checkpoint exports are sent to, served by `torchyard exporter` "
        "(they need no GPU, so they never wait behind training on a job's pool).",
    )
    export_concurrency: int = Field(
        default=2, ge=1, description="Exports one `torchyard exporter` process runs at once."
    )
    reserve_after_s: float | None = Field(
        default=600.0,
        gt=0,
        description="A queued job at the head of its pool that has not fitted any worker's free "
        "devices for this many seconds stops workers that could fit it from claiming smaller "
        "jobs, so it is not starved by them (core.scheduling.claim); None: never.",
    )
    advertise_host: str = Field(
        default="127.0.0.1",
        description="Address other nodes of a multi-node job reach this worker's host at: node 0 "
        "publishes it as the c10d rendezvous endpoint, and torchrun's `--local-addr`.",
    )
    hang_timeout_floor_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds without step progress after which a job that sets no "
        "`limits.hang_timeout_s` counts as hung, at the least (the derived timeout is the larger "
        "of this and 10x the median time between the job's step reports).",
    )
    gang_assemble_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="How long node 0 of a multi-node job waits for the other nodes to join "
        "before it releases the gang and the job goes back to the queue.",
    )

    slot_prices: dict[str, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description="JSON: pool -> price of one slot-hour (one GPU, or one CPU slot, for an "
        "hour) in `currency`; usage of a pool without a price costs 0, and a job on it cannot "
        "set `limits.max_cost`.",
    )
    slurm_pools: dict[str, SlurmPool] = Field(
        default_factory=dict,
        description="JSON: pool -> its Slurm settings (`SlurmPool`); such a pool's jobs are placed "
        "by Slurm through `python -m workers slurm --pool NAME` instead of Celery workers.",
    )
    currency: str = Field(
        default="USD", min_length=1, max_length=10, description="The unit of `slot_prices`."
    )
    usage_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often a worker measures a running node's CPU-seconds into "
        "`job_nodes.cpu_seconds` and checks the job's cost against `limits.max_cost` (seconds).",
    )

    sandbox: Literal["auto", "bwrap", "none"] = Field(
        default="auto",
        description="How a worker contains a job's ranks (workers/isolation/sandbox.py): `bwrap` "
        "runs every rank in a bubblewrap sandbox (own PID, user, IPC and mount namespaces; only "
        "the job's own files) and refuses to start where the host cannot make one; `none` runs "
        "them as the worker's children, seeing what the worker sees (accepts that risk); "
        "`auto`: `bwrap` where the host can, else `none` with a warning, except in "
        "production, where a worker that cannot sandbox refuses to start.",
    )
    slot_memory_mb: int | None = Field(
        default=None,
        gt=0,
        description="Memory of one slot in MiB (workers/isolation/cgroups.py): a job's node may "
        "use its leased slots' worth in a cgroup of its own, past which the kernel's OOM "
        "killer ends it alone (`oom`); default the host's memory divided by its slots.",
    )
    venv_dir: Path | None = Field(
        default=None,
        description="Where a worker keeps the virtual environments of entrypoint jobs' "
        "`requirements` (workers/entrypoint/venvs.py), one per requirement set, reused; default "
        "`TORCHYARD_HOME/venvs`.",
    )
    # Quotas, preemption and request rates (issue 14): core/scheduling/quotas.py,
    # core/scheduling/preemption_apply.py, api/ratelimit.py.
    preemption_pools: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Pools where a queued job of higher priority that does not fit preempts "
        "running jobs of lower priority (they checkpoint and go back to the queue; "
        "core/scheduling/preemption_apply.py): comma-separated or a JSON list, `*` for every pool; "
        "default none.",
    )
    preemption_min_run_s: float = Field(
        default=120.0,
        ge=0,
        description="Seconds a job's attempt runs before it may be preempted (no thrash).",
    )
    quota_retry_after_s: int = Field(
        default=60,
        ge=1,
        le=86400,
        description="`Retry-After` (seconds) of a submission refused by a project's "
        "`max_queued_jobs` (429 `quota_exceeded`).",
    )
    rate_limit_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Requests per minute one API key may make (a moving window; the `limits` "
        "library, in Redis when the broker is Redis, else in the process); None: no limit. "
        "Over it: 429 `too_many_requests` with `Retry-After`.",
    )
    rate_limit_burst: int | None = Field(
        default=None,
        ge=1,
        description="Requests one API key may make within any one second (with "
        "`rate_limit_per_minute`); None: only the per-minute limit.",
    )

    oidc_issuer: str | None = Field(
        default=None,
        description="SSO: the OIDC issuer (`iss`) whose access tokens (JWT) the API accepts as "
        "bearer tokens, such as `https://login.example.com/realms/ml`; None: API keys only.",
    )
    oidc_audience: str | None = Field(
        default=None,
        description="The `aud` an OIDC token must carry (the API's client id at the issuer); "
        "required with `oidc_issuer`.",
    )
    oidc_jwks_url: str | None = Field(
        default=None,
        description="Where the issuer's signing keys (JWKS) are; None: the `jwks_uri` of its "
        "`/.well-known/openid-configuration`, fetched once and cached.",
    )
    oidc_groups_claim: str = Field(
        default="groups", description="The token claim that lists the caller's groups."
    )
    oidc_actor_claim: str = Field(
        default="sub",
        description="The claim that names the caller in audit rows and job owners (`sub`, or "
        "`email`, ...); `sub` when the token lacks it.",
    )
    oidc_group_roles: dict[str, OidcGrant] = Field(
        default_factory=dict,
        description='JSON: group -> {"project": name, "role": viewer|member|admin}. A token '
        "whose groups map to none of these is refused (401).",
    )
    oidc_algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "ES256"],
        description="JWS algorithms accepted on OIDC tokens; only asymmetric ones "
        "(RS*, PS*, ES*, EdDSA) are allowed.",
    )
    oidc_leeway_s: float = Field(
        default=30.0, ge=0, description="Clock skew tolerated on `exp` and `nbf` (seconds)."
    )
    oidc_jwks_cache_s: float = Field(
        default=300.0, gt=0, description="How long fetched signing keys are reused (seconds)."
    )
    oidc_jwks_cooldown_s: float = Field(
        default=30.0,
        ge=0,
        description="A token with an unknown `kid` refetches the JWKS (key rotation) at most "
        "once per this many seconds, so forged kids cannot flood the issuer.",
    )
    oidc_http_timeout_s: float = Field(
        default=5.0, gt=0, description="Timeout of discovery and JWKS requests (seconds)."
    )
    trusted_proxies: int = Field(
        default=0,
        ge=0,
        description="How many reverse proxies in front of the API append to `X-Forwarded-For`: "
        "the audit log's source address is the entry that many from its right end (the address "
        "the outermost trusted proxy saw); 0: the header is ignored and the socket peer is used.",
    )

    webhook_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Webhook destinations allowed although private, loopback or link-local "
        "(core/webhooks/subscriptions.py refuses those otherwise): CIDRs (`10.0.0.0/8`) or host "
        "names, "
        "comma-separated or a JSON list.",
    )
    webhook_deliver_in_api: bool = Field(
        default=True,
        description="Run the webhook delivery loop in each API process (api.main's lifespan). "
        "Several processes may: they claim deliveries with `FOR UPDATE SKIP LOCKED`.",
    )
    webhook_deliver_interval_s: float = Field(
        default=2.0, gt=0, description="How often the delivery loop looks for due deliveries."
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds a webhook receiver has to answer one delivery."
    )
    session_idle_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="A training session (the Tinker-compatible API, `/tinker`) whose client sent "
        "no heartbeat for this many seconds is ended by the reconcile loop (its client beats "
        "every 10 s).",
    )

    @field_validator("webhook_allow", "preemption_pools", mode="before")
    @classmethod
    def _split_allow(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _defaults_and_production_checks(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{(self.home / 'torchyard.db').resolve()}"
        if not self.storage_url:
            self.storage_url = str((self.home / "storage").resolve())
        if self.worker_timeout_s < 2 * self.worker_heartbeat_interval_s:
            raise ValueError(
                "TORCHYARD_WORKER_TIMEOUT_S must be at least twice "
                "TORCHYARD_WORKER_HEARTBEAT_INTERVAL_S, or live workers count as gone"
            )
        if self.oidc_issuer is not None and not self.oidc_audience:
            raise ValueError("TORCHYARD_OIDC_AUDIENCE is required with TORCHYARD_OIDC_ISSUER")
        unsafe = sorted(set(self.oidc_algorithms) - OIDC_ALGORITHMS)
        if unsafe or not self.oidc_algorithms:
            raise ValueError(
                f"TORCHYARD_OIDC_ALGORITHMS: {unsafe or 'empty'} refused; allowed: "
                f"{sorted(OIDC_ALGORITHMS)}"
            )
        if self.env == "production":
            if self.database_url.startswith("sqlite"):
                raise ValueError("TORCHYARD_DATABASE_URL: production needs Postgres, not SQLite")
            if self.broker_url.startswith("filesystem"):
                raise ValueError("TORCHYARD_BROKER_URL: production needs Redis, not filesystem://")
        return self

    @property
    def direct_database_url(self) -> str:
        """Postgres itself: `database_direct_url`, else `database_url` (no pooler between).
        Resolved on each read, so a copy with another `database_url` follows it."""
        return self.database_direct_url or self.database_url

    @property
    def is_local_storage(self) -> bool:
        return "://" not in self.storage_url or self.storage_url.startswith("file://")

    @property
    def storage_path(self) -> Path:
        """The storage root as a local path. Raises ValueError for remote storage."""
        if not self.is_local_storage:
            raise ValueError(f"storage {self.storage_url!r} is not a local directory")
        return Path(self.storage_url.removeprefix("file://")).resolve()


@lru_cache
def get_settings() -> Settings:
    return Settings()
