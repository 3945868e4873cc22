"""Python SDK for the Torchyard REST API (docs/CONTRACTS.md, section 4).

    from torchyard import Client

    with Client() as client:                      # TORCHYARD_URL / TORCHYARD_API_KEY / login
        job = client.jobs.create(spec)            # dict or jobspec.job.JobSpec
        archive = client.code.upload("src/")      # training code for `entrypoint` jobs
        for item in client.jobs.follow(job.id):   # Job | Event | MetricPoint | LogLine
            ...

Every method raises an `ApiError` subclass (`NotFound`, `Conflict`, `ValidationFailed`, ...)
when the API answers with an error, and `ConnectionFailed` when it cannot be reached.

One module of ~570 lines, on purpose: the transport (retries, errors, auth) and the `Client` with
its jobs, datasets and metrics resources, which share that transport's helpers; the other resources
have their own modules (`torchyard.access`, `code`, `exports`, `sessions`, `sweeps`, `usage`).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import connect_sse
from pydantic import BaseModel

from torchyard.access import Keys, Members
from torchyard.code import Code
from torchyard.config import load_config
from torchyard.errors import ConnectionFailed, ServerError, error_from_response
from torchyard.exports import Exports
from torchyard.sessions import Sessions
from torchyard.sweeps import Sweeps
from torchyard.types import (
    Checkpoint,
    Dataset,
    DatasetFile,
    DatasetPreview,
    DatasetSample,
    Evaluation,
    Event,
    Job,
    LogLine,
    Me,
    MetricPoint,
    MetricSeries,
    Page,
)
from torchyard.usage import Usage
from torchyard.workers import Workers

FollowItem = Job | Event | MetricPoint | LogLine


class Client:
    """A connection to one Torchyard API with one API key.

    `base_url` and `api_key` default to the environment and the ``torchyard login`` file (see
    `torchyard.config`). `timeout` is per request, in seconds. Use as a context manager, or
    call `close()`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
    ) -> None:
        config = load_config(base_url, api_key)
        self.base_url = config.url
        self.api_key = config.api_key
        self.timeout = timeout
        headers = {"User-Agent": "torchyard-python"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self._http = httpx.Client(
            base_url=config.url,
            headers=headers,
            timeout=timeout,
            # Retries only failed connects (the request never left), so POSTs stay safe.
            transport=httpx.HTTPTransport(retries=2),
        )
        self.jobs = Jobs(self)
        self.datasets = Datasets(self)
        self.exports = Exports(self)
        self.code = Code(self)
        self.usage = Usage(self)
        self.keys = Keys(self)
        self.members = Members(self)
        self.sweeps = Sweeps(self)
        self.sessions = Sessions(self)
        self.workers = Workers(self)

    @property
    def http(self) -> httpx.Client:
        """The pooled `httpx.Client` (base URL and key set): `torchyard.transport.Transport`."""
        return self._http

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        files: Any = None,
        data: dict[str, str] | None = None,
        timeout: httpx.Timeout | float | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON answer (None for an empty body).

        Raises the `ApiError` subclass for the status on a non-2xx answer, `ConnectionFailed`
        when the server cannot be reached or does not answer within the timeout.
        """
        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(
                method,
                path,
                params=params,
                json=json,
                headers=headers,
                files=files,
                data=data,
                timeout=timeout if timeout is not None else self.timeout,
            )
        except httpx.TimeoutException as exc:
            raise ConnectionFailed(f"{method} {self.base_url}{path}: timed out ({exc})") from exc
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"cannot reach the API at {self.base_url}: {exc}") from exc
        if response.is_success:
            return response.json() if response.content else None
        try:
            body = response.json()
        except ValueError:
            body = None
        raise error_from_response(response.status_code, body, response.text)

    def me(self) -> Me:
        """The project and key this client authenticates as."""
        return Me.model_validate(self.request("GET", "/v1/me"))

    def spec_schema(self) -> dict[str, Any]:
        """The server's JobSpec JSON Schema."""
        result: dict[str, Any] = self.request("GET", "/v1/spec/schema")
        return result

    def ready(self) -> bool:
        """True when ``/readyz`` answers 200 (database reachable, migrations applied)."""
        try:
            self.request("GET", "/readyz", timeout=5.0)
        except (ConnectionFailed, ServerError):
            return False
        return True


class Jobs:
    """``client.jobs``: submit, list, inspect, cancel and follow training jobs."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self, spec: dict[str, Any] | BaseModel, *, idempotency_key: str | None = None
    ) -> Job:
        """Submit a job. `spec` is a `JobSpec` or its dict form.

        With `idempotency_key`, resubmitting the same body returns the first job instead of a
        new one. Raises `ValidationFailed` (422) naming the JSON path of each bad field,
        `Conflict` when the key was used with another body.
        """
        body = spec.model_dump(mode="json") if isinstance(spec, BaseModel) else spec
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return Job.model_validate(
            self._client.request("POST", "/v1/jobs", json=body, headers=headers)
        )

    def list(
        self,
        *,
        state: str | Sequence[str] | None = None,
        name: str | None = None,
        dataset: str | None = None,
        limit: int | None = None,
        cursor: str | int | None = None,
    ) -> Page[Job]:
        """One page of jobs, newest first. `state` filters (one or several), `name` matches a
        substring, `dataset` (an id or name) keeps the jobs whose spec names that dataset,
        `limit` is 1-200 (server default 50). Raises `NotFound` for a dataset the project
        does not have."""
        states = [state] if isinstance(state, str) else list(state or [])
        params = {
            "state": states or None,
            "name": name,
            "dataset": dataset,
            "limit": limit,
            "cursor": cursor,
        }
        return Page[Job].model_validate(self._client.request("GET", "/v1/jobs", params=params))

    def iter(
        self,
        *,
        state: str | Sequence[str] | None = None,
        name: str | None = None,
        dataset: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Job]:
        """Every matching job, newest first, fetching pages as needed."""
        cursor: str | int | None = None
        while True:
            page = self.list(
                state=state, name=name, dataset=dataset, limit=page_size, cursor=cursor
            )
            yield from page.items
            if page.next_cursor is None or not page.items:
                return
            cursor = page.next_cursor

    def get(self, job_id: int) -> Job:
        """One job. Raises `NotFound`."""
        return Job.model_validate(self._client.request("GET", f"/v1/jobs/{job_id}"))

    def update(
        self, job_id: int, *, labels: dict[str, str] | None = None, note: str | None = None
    ) -> Job:
        """Replace the job's labels (the whole set; ``{}`` removes them) and/or set its note
        (``""`` clears it); None leaves one as it is. Works in any state. Raises
        `ValidationFailed` (422, naming the field: at most 64 labels, keys 1-100 and values up
        to 200 printable characters, a note up to 10,000) and `NotFound`."""
        body: dict[str, Any] = {}
        if labels is not None:
            body["labels"] = labels
        if note is not None:
            body["note"] = note
        return Job.model_validate(self._client.request("PATCH", f"/v1/jobs/{job_id}", json=body))

    def cancel(self, job_id: int) -> Job:
        """Ask the job to stop; works in every non-terminal state. Returns the job (state
        ``cancelling`` or ``cancelled``). Raises `Conflict` when it already finished."""
        return Job.model_validate(self._client.request("POST", f"/v1/jobs/{job_id}/cancel"))

    def pause(self, job_id: int) -> Job:
        """Checkpoint and stop a running job (state ``pausing``, then ``paused``); a queued job
        leaves the queue. Raises `Conflict` in other states."""
        return Job.model_validate(self._client.request("POST", f"/v1/jobs/{job_id}/pause"))

    def resume(self, job_id: int) -> Job:
        """Queue a paused job again; it continues from its latest checkpoint. Raises
        `Conflict` unless the job is paused."""
        return Job.model_validate(self._client.request("POST", f"/v1/jobs/{job_id}/resume"))

    def retry(self, job_id: int) -> Job:
        """Queue a failed or cancelled job again, from its latest checkpoint, with a fresh
        restart budget. Raises `Conflict` in other states."""
        return Job.model_validate(self._client.request("POST", f"/v1/jobs/{job_id}/retry"))

    def events(
        self, job_id: int, *, after: int | None = None, limit: int | None = None
    ) -> Page[Event]:
        """One page of the job's events with id > `after`, oldest first."""
        answer = self._client.request(
            "GET", f"/v1/jobs/{job_id}/events", params={"after": after, "limit": limit}
        )
        return Page[Event].model_validate(answer)

    def iter_events(self, job_id: int, *, after: int | None = None) -> Iterator[Event]:
        """All events with id > `after`, oldest first, across pages."""
        return _drain(lambda cursor: self.events(job_id, after=cursor), after)

    def metrics(
        self, job_id: int, *, names: Sequence[str] | None = None
    ) -> builtins.list[MetricSeries]:
        """The job's metric series (all, or only `names`), each ascending by step."""
        params = {"names": ",".join(names) if names else None}
        answer = self._client.request("GET", f"/v1/jobs/{job_id}/metrics", params=params)
        return [MetricSeries.model_validate(s) for s in answer.get("series", [])]

    def stream(
        self, job_id: int, *, last_event_id: str | None = None
    ) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """The job's server-sent events as (id, kind, data) until it is terminal; kinds: `job`,
        `event`, `metric` ({step, time, values}), `log`, `end` (last). Pass the last id seen
        as `last_event_id` to resume after a disconnect without gaps or duplicates. Raises
        `ApiError` for an error answer, `ConnectionFailed` when the connection drops."""
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        timeout = httpx.Timeout(self._client.timeout, read=60.0)
        try:
            with connect_sse(
                self._client._http,
                "GET",
                f"/v1/jobs/{job_id}/stream",
                headers=headers,
                timeout=timeout,
            ) as source:
                response = source.response
                if not response.is_success:
                    response.read()
                    try:
                        body = response.json()
                    except ValueError:
                        body = None
                    raise error_from_response(response.status_code, body, response.text)
                for message in source.iter_sse():
                    if message.data:  # a `retry:`-only block carries no message
                        yield message.id, message.event, message.json()
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"stream of job {job_id} broke: {exc}") from exc

    def logs(
        self,
        job_id: int,
        *,
        rank: int | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> Page[LogLine]:
        """One page of log lines with id > `after`, oldest first; `rank` -1 is the launcher.
        `limit` is 1-5000 (server default 1000)."""
        params = {"rank": rank, "after": after, "limit": limit}
        answer = self._client.request("GET", f"/v1/jobs/{job_id}/logs", params=params)
        return Page[LogLine].model_validate(answer)

    def iter_logs(
        self, job_id: int, *, rank: int | None = None, after: int | None = None
    ) -> Iterator[LogLine]:
        """All log lines with id > `after`, oldest first, across pages."""
        return _drain(lambda cursor: self.logs(job_id, rank=rank, after=cursor), after)

    def checkpoints(self, job_id: int) -> builtins.list[Checkpoint]:
        """The job's complete checkpoints, each with its export (`client.exports`) if any."""
        answer = self._client.request("GET", f"/v1/jobs/{job_id}/checkpoints")
        return [Checkpoint.model_validate(c) for c in answer.get("items", [])]

    def evals(self, job_id: int) -> builtins.list[Evaluation]:
        """The job's evaluations: the ones it ran (an eval job, `evaluate` in its spec) and
        the ones run on its checkpoints (a training job), by checkpoint step."""
        answer = self._client.request("GET", f"/v1/jobs/{job_id}/evals")
        return [Evaluation.model_validate(e) for e in answer.get("items", [])]

    def wait(self, job_id: int, *, poll_s: float = 2.0, timeout_s: float | None = None) -> Job:
        """Poll until the job is terminal and return it. Raises `TimeoutError` after
        `timeout_s` seconds."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if job.is_terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job.state} after {timeout_s} s")
            time.sleep(poll_s)

    def follow(
        self,
        job_id: int,
        *,
        poll_s: float = 1.0,
        events: bool = True,
        metrics: bool = True,
        logs: bool = False,
        rank: int | None = None,
        max_failures: int = 10,
        on_poll: Callable[[Job], None] | None = None,
    ) -> Iterator[FollowItem]:
        """Yield what is new about a job until it is terminal, from its server-sent events
        (`stream`): only new items cross the network, never the history again.

        Yields the `Job` whenever its state, attempt or step changes, new `MetricPoint`s (step
        order), new `Event`s and, with `logs`, new `LogLine`s (of `rank` only, if given). The
        server sends everything recorded before the terminal state before it ends the stream.
        A dropped connection resumes after the last message seen (`Last-Event-ID`: no gaps, no
        duplicates); up to `max_failures` consecutive connection or 5xx errors are waited out,
        `poll_s` seconds apart. `on_poll(job)` runs at every `job` message (a state change, and
        the server's refresh every few seconds: a place to refresh a display or to raise when
        something the caller watches has died).
        """
        cursor = _FollowCursor()
        last_id: str | None = None
        failures = 0
        while True:
            try:
                for msg_id, kind, data in self.stream(job_id, last_event_id=last_id):
                    last_id = msg_id or last_id
                    failures = 0
                    if kind == "end":
                        return
                    yield from cursor.on_message(kind, data, events, metrics, logs, rank)
                    if kind == "job" and on_poll is not None and cursor.job is not None:
                        on_poll(cursor.job)
            except (ConnectionFailed, ServerError) as exc:
                interrupt = _interrupt_behind(exc)
                if interrupt is not None:  # Ctrl-C while closing the stream: not a dropped one
                    raise interrupt from None
                failures += 1
                if failures > max_failures:
                    raise
            # The stream ended without `end` (an API restart, a watcher too slow): resume.
            time.sleep(poll_s)


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt `exc` was raised while handling, if any: Ctrl-C during a stream's
    read makes httpcore close the connection, and an error of that close then replaces the
    interrupt (it is only the error's `__context__`)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class _FollowCursor:
    """Turns a job's stream messages into `Jobs.follow` items, yielding each change once."""

    def __init__(self) -> None:
        self.job: Job | None = None
        self.last_job: tuple[Any, ...] | None = None
        self.seen_steps: dict[str, int] = {}  # per metric: a restart replays lower steps

    def on_message(
        self,
        kind: str,
        data: dict[str, Any],
        events: bool,
        metrics: bool,
        logs: bool,
        rank: int | None,
    ) -> Iterator[FollowItem]:
        if kind == "job":
            self.job = Job.model_validate(data)
            yield from self._job_change(self.job)
        elif kind == "metric":
            step = int(data["step"])
            if self.job is not None and step > (self.job.current_step or -1):
                self.job = self.job.model_copy(update={"current_step": step})
                yield from self._job_change(self.job)
            for name, value in sorted(data["values"].items()) if metrics else ():
                if step > self.seen_steps.get(name, -1):
                    self.seen_steps[name] = step
                    # NaN and infinities arrive as strings ("NaN", "Infinity").
                    yield MetricPoint(name=name, step=step, value=float(value))
        elif kind == "event" and events:
            yield Event.model_validate(data)
        elif kind == "log" and logs:
            line = LogLine.model_validate(data)
            if rank is None or line.rank == rank:
                yield line

    def _job_change(self, job: Job) -> Iterator[Job]:
        key = (job.state, job.attempt, job.current_step, job.max_steps)
        if key != self.last_job:
            self.last_job = key
            yield job


def _drain(fetch: Any, after: int | None) -> Iterator[Any]:
    """Page through an ``after``-cursored list (events, logs) until its last page."""
    while True:
        page = fetch(after)
        for item in page.items:
            after = item.id
            yield item
        if page.next_cursor is None or not page.items:
            return


class Datasets:
    """``client.datasets``: training text registered in the project."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def register(
        self,
        name: str,
        uri: str,
        *,
        format: str | None = None,
        token_dtype: str | None = None,
        include: list[str] | None = None,
        exclude: list[str] | None = None,
    ) -> Dataset:
        """Register a file or directory the server can read, under one of its allowed roots.

        A file is checked record by record as `format` (None: the server detects it; a
        directory is `text`); `token_dtype` (`uint16`/`uint32`) reads a `.bin` token file.
        A directory's files are those `include` (glob patterns; server default `**/*`)
        selects minus `exclude` (fnmatch; server default: installed packages, byte-code
        caches, `.git`): kept with the dataset, every job on it reads only those, and of them
        only the UTF-8 text (the rest is listed in `left_out`).
        The server hashes every file before answering, so this waits at least five minutes
        (or the client's timeout, if longer). Raises `PermissionDenied` outside the roots,
        `ValidationFailed` for a missing or empty path or invalid records (each bad record's
        line and field path in `details`), `Conflict` when the name is taken.
        """
        body = {
            "name": name,
            "uri": uri,
            "format": format,
            "token_dtype": token_dtype,
            "include": include,
            "exclude": exclude,
        }
        answer = self._client.request(
            "POST",
            "/v1/datasets",
            json={k: v for k, v in body.items() if v is not None},
            timeout=max(self._client.timeout, 300.0),
        )
        return Dataset.model_validate(answer)

    def upload(
        self,
        name: str,
        path: str | Path,
        *,
        format: str | None = None,
        token_dtype: str | None = None,
        timeout_s: float | None = None,
    ) -> Dataset:
        """Upload one local file, streamed in chunks (never read whole into memory).

        The server checks every record as `format` (None: detected from the file type and its
        first record) before keeping it. `timeout_s` bounds each network read/write (default:
        the client's timeout, at least five minutes). Raises `ValidationFailed` for invalid
        records (the first 100 with line and field path in `details`, the total in the
        message), `PayloadTooLarge` over the server's limit, `IsADirectoryError` for a
        directory (register a server-side directory instead, or archive it).
        """
        path = Path(path)
        if path.is_dir():
            raise IsADirectoryError(f"{path}: upload takes one file; use register() for dirs")
        timeout = timeout_s if timeout_s is not None else max(self._client.timeout, 300.0)
        with path.open("rb") as fh:
            answer = self._client.request(
                "POST",
                "/v1/datasets/upload",
                files={"file": (path.name, fh, "application/octet-stream")},
                data={
                    k: v
                    for k, v in {"name": name, "format": format, "token_dtype": token_dtype}.items()
                    if v is not None
                },
                timeout=timeout,
            )
        return Dataset.model_validate(answer)

    def list(self) -> list[Dataset]:
        """All datasets of the project."""
        answer = self._client.request("GET", "/v1/datasets")
        return [Dataset.model_validate(d) for d in answer.get("items", [])]

    def get(self, dataset_id: str) -> Dataset:
        """One dataset. Raises `NotFound`."""
        return Dataset.model_validate(self._client.request("GET", f"/v1/datasets/{dataset_id}"))

    def files(
        self, dataset_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[DatasetFile]:
        """One page of the dataset's files (path relative to its location, size in bytes), in
        path order; `limit` is 1-1000 (server default 100). Raises `NotFound`, `Conflict`
        (its location cannot be read now)."""
        params = {"limit": limit, "cursor": cursor}
        answer = self._client.request("GET", f"/v1/datasets/{dataset_id}/files", params=params)
        return Page[DatasetFile].model_validate(answer)

    def sample(self, dataset_id: str, *, limit: int | None = None) -> DatasetSample:
        """The dataset's first `limit` records (1-20, server default 5) as a job reads them;
        strings over 2,000 characters and lists over 64 items are cut. Raises `NotFound`,
        `Conflict` (its location cannot be read now)."""
        answer = self._client.request(
            "GET", f"/v1/datasets/{dataset_id}/sample", params={"limit": limit}
        )
        return DatasetSample.model_validate(answer)

    def preview(
        self,
        dataset_id: str,
        *,
        model: dict[str, Any] | None = None,
        model_path: str | None = None,
        chat_template: str | None = None,
        loss_on: str | None = None,
        seq_len: int | None = None,
        truncation: str | None = None,
        num_examples: int = 8,
    ) -> DatasetPreview:
        """Tokenize the dataset's first `num_examples` records as a job would and return each
        token with its mask bit and role, the supervised share per role, and the mask
        verifier's verdict (a refusal is returned, not raised).

        `model` is a job spec's `model` section (default: the byte-level GPT); `model_path`
        is short for `{"kind": "hf", "hf": {"path_or_id": model_path}}` (a server-side model
        directory with a tokenizer). `chat_template`: null (the tokenizer's, else ChatML),
        `chatml` or a Jinja string. `seq_len` None: `model.seq_len`. Raises `NotFound`,
        `Conflict` (a `text`, `tokens` or `preference` dataset), `ValidationFailed` (bad
        template, loss_on or model path, with the field path), `PermissionDenied` (a model
        path outside the server's data roots).
        """
        if model_path is not None:
            model = {"kind": "hf", "hf": {"path_or_id": model_path}}
        body = {
            "model": model,
            "chat_template": chat_template,
            "loss_on": loss_on,
            "seq_len": seq_len,
            "truncation": truncation,
            "num_examples": num_examples,
        }
        answer = self._client.request(
            "POST",
            f"/v1/datasets/{dataset_id}/preview",
            json={k: v for k, v in body.items() if v is not None},
            timeout=max(self._client.timeout, 120.0),
        )
        return DatasetPreview.model_validate(answer)
