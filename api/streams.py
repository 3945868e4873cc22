"""Server-sent event streams of a job: one database poller per job, fanned out to its watchers.

A `StreamHub` (one per API process, on `app.state.streams`) keeps one `JobFeed` per watched
job: a single asyncio task that reads, every `poll_s` seconds, the job row and what is new
since its cursor (events and log lines by id, metric lines by trainer time and step) and puts
the resulting messages on every watcher's queue. So N watchers of a job cost one query set
per tick, not N. A watcher that connects (or reconnects with `Last-Event-ID`) first catches
up from the database once, from its own cursor, then follows the feed; messages it already
has are skipped by comparing cursors per kind, so a resume has no duplicates and no gaps.

Every message's SSE `id` is the cursor after it, `"{event_id}.{log_id}.{metric_time}.
{metric_step}"`; the stream ends with an `end` message once the job is terminal and
everything recorded before that has been sent. Format: the WHATWG HTML "Server-sent events"
section (https://html.spec.whatwg.org/multipage/server-sent-events.html).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api import redaction
from core.jobs import reports as queries
from core.platform.server_paths import ServerPaths
from core.platform.tables import TERMINAL_STATES, Job

log = logging.getLogger("torchyard.api.streams")

PAGE = 1000  # rows per kind per read
QUEUE_SIZE = 10_000  # messages a slow watcher may lag behind before it is dropped
KEEPALIVE_S = 15.0
# A `job` message is also sent this often while nothing changes state, so a follower sees the
# worker's heartbeat and the job's progress fields (`eta_s`, `running_s`) stay fresh.
JOB_REFRESH_S = 5.0


class _MetricLine(BaseModel):
    # NaN / inf as strings, like the metrics endpoint.
    model_config = ConfigDict(ser_json_inf_nan="strings")
    step: int
    time: float
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far a stream has got: last event id, last log id, last metric line (time, step)."""

    event: int = 0
    log: int = 0
    metric_time: float = 0.0
    metric_step: int = -1

    def __str__(self) -> str:
        return f"{self.event}.{self.log}.{self.metric_time!r}.{self.metric_step}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """The cursor of a `Last-Event-ID`; the start for a missing or malformed one."""
        if not text:
            return cls()
        try:
            event, log_id, rest = text.split(".", 2)
            metric_time, metric_step = rest.rsplit(".", 1)
            return cls(int(event), int(log_id), float(metric_time), int(metric_step))
        except ValueError:
            return cls()


@dataclass(frozen=True, slots=True)
class Message:
    """One SSE message: `kind` is `job` | `event` | `log` | `metric` | `end`."""

    kind: str
    data: str
    cursor: Cursor
    key: Any = None  # the kind's own ordering key, for de-duplication

    def encode(self) -> bytes:
        return f"id: {self.cursor}\nevent: {self.kind}\ndata: {self.data}\n\n".encode()


@dataclass
class Batch:
    """What one read found: the job, new messages (cursor order per kind), whether it ended."""

    job: Job | None
    messages: list[Message]
    cursor: Cursor
    more: bool


def read_after(session: Session, job_id: int, cursor: Cursor, paths: ServerPaths) -> Batch:
    """One page of each kind after `cursor`, without the server's directories (`paths`). The
    job row is read first, so when it is terminal everything recorded before the terminal state
    is in this or a following page."""
    job = session.get(Job, job_id, populate_existing=True)
    out: list[Message] = []
    if job is None:
        return Batch(None, out, cursor, more=False)
    events, _ = queries.events_page(session=session, job_id=job_id, after=cursor.event, limit=PAGE)
    lines, _ = queries.logs_page(session=session, job_id=job_id, after=cursor.log, limit=PAGE)
    points, more_points = queries.metric_steps_after(
        session=session,
        job_id=job_id,
        time=cursor.metric_time,
        step=cursor.metric_step,
        limit=PAGE * 5,
    )
    c = cursor
    for p in points:
        c = replace(c, metric_time=p.time, metric_step=p.step)
        data = _MetricLine(step=p.step, time=p.time, values=p.values).model_dump_json()
        out.append(Message("metric", data, c, (p.time, p.step)))
    for e in events:
        c = replace(c, event=e.id)
        out.append(Message("event", redaction.event(e, paths).model_dump_json(), c, e.id))
    for x in lines:
        c = replace(c, log=x.id)
        out.append(Message("log", redaction.log_line(x, paths).model_dump_json(), c, x.id))
    more = len(events) == PAGE or len(lines) == PAGE or more_points
    return Batch(job, out, c, more=more)


def job_message(job: Job, cursor: Cursor, paths: ServerPaths, *, refresh: bool = False) -> Message:
    """The job as the API shows it; `refresh`: sent on a timer, not for a state change."""
    data = redaction.job(job, paths).model_dump_json()
    return Message("job", data, cursor, "refresh" if refresh else None)


def end_message(job: Job | None, cursor: Cursor) -> Message:
    state = job.state if job is not None else "deleted"
    return Message("end", json.dumps({"state": state}), cursor)


def is_new(message: Message, sent: Cursor) -> bool:
    """Whether a watcher at `sent` still needs `message` (de-duplication per kind)."""
    if message.kind == "event":
        return bool(message.key > sent.event)
    if message.kind == "log":
        return bool(message.key > sent.log)
    if message.kind == "metric":
        return bool(message.key > (sent.metric_time, sent.metric_step))
    return True


@dataclass
class JobFeed:
    """The one poller of one job in this process, and the queues of its watchers."""

    job_id: int
    watchers: set[asyncio.Queue[Message | None]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # start cursor taken


class StreamHub:
    """Per-process fan-out of job feeds. `sessionmaker` opens DB sessions (sync, threadpool);
    every watcher gets the same messages, without the server's directories (`paths`)."""

    def __init__(
        self, sessionmaker: Callable[[], Session], *, paths: ServerPaths, poll_s: float = 0.5
    ) -> None:
        self.sessionmaker = sessionmaker
        self.paths = paths
        self.poll_s = poll_s
        self.feeds: dict[int, JobFeed] = {}
        self.polls = 0  # database reads by feeds, for tests and /metrics

    async def subscribe(self, job_id: int) -> asyncio.Queue[Message | None]:
        """A queue of the job's feed messages, once the feed has its start cursor: so a
        catch-up read begun after this returns overlaps the feed instead of leaving a gap."""
        feed = self.feeds.get(job_id)
        if feed is None:
            feed = self.feeds[job_id] = JobFeed(job_id)
            feed.task = asyncio.create_task(self._poll(feed), name=f"job-feed-{job_id}")
        queue: asyncio.Queue[Message | None] = asyncio.Queue(QUEUE_SIZE)
        feed.watchers.add(queue)
        try:
            await feed.ready.wait()
        except BaseException:  # the client went away before the feed started
            self.unsubscribe(job_id, queue)
            raise
        return queue

    def unsubscribe(self, job_id: int, queue: asyncio.Queue[Message | None]) -> None:
        feed = self.feeds.get(job_id)
        if feed is None:
            return
        feed.watchers.discard(queue)
        if not feed.watchers and feed.task is not None:
            feed.task.cancel()
            del self.feeds[job_id]

    @property
    def num_watchers(self) -> int:
        return sum(len(f.watchers) for f in self.feeds.values())

    async def close(self) -> None:
        for feed in list(self.feeds.values()):
            if feed.task is not None:
                feed.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feed.task
        self.feeds.clear()

    def _start(self, job_id: int) -> Cursor:
        with self.sessionmaker() as session:
            event, line = queries.latest_ids(session=session, job_id=job_id)
            t, step = queries.latest_metric_mark(session=session, job_id=job_id)
        return Cursor(event, line, t, step)

    def _read(self, job_id: int, cursor: Cursor) -> Batch:
        with self.sessionmaker() as session:
            return read_after(session, job_id, cursor, self.paths)

    async def _poll(self, feed: JobFeed) -> None:
        try:
            try:
                cursor = await run_in_threadpool(self._start, feed.job_id)
            finally:
                feed.ready.set()
            state = None
            sent_at = time.monotonic()
            while feed.watchers:
                batch = await run_in_threadpool(self._read, feed.job_id, cursor)
                self.polls += 1
                cursor = batch.cursor
                out = list(batch.messages)
                due = time.monotonic() - sent_at >= JOB_REFRESH_S
                if batch.job is not None and (batch.job.state != state or due):
                    out.append(
                        job_message(batch.job, cursor, self.paths, refresh=batch.job.state == state)
                    )
                    state, sent_at = batch.job.state, time.monotonic()
                ended = batch.job is None or batch.job.state in TERMINAL_STATES
                if ended and not batch.more:
                    out.append(end_message(batch.job, cursor))
                self._publish(feed, out)
                if ended and not batch.more:
                    break
                if not batch.more:
                    await asyncio.sleep(self.poll_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("job %s: stream feed failed; its watchers will reconnect", feed.job_id)
        finally:
            for queue in list(feed.watchers):
                _offer(queue, None)  # None: the feed is gone; the watcher ends its response
            if self.feeds.get(feed.job_id) is feed:
                del self.feeds[feed.job_id]

    def _publish(self, feed: JobFeed, messages: list[Message]) -> None:
        for queue in list(feed.watchers):
            for message in messages:
                if not _offer(queue, message):
                    log.warning(
                        "job %s: dropping a watcher %d messages behind", feed.job_id, queue.qsize()
                    )
                    feed.watchers.discard(queue)
                    _offer_end(queue)
                    break


def _offer(queue: asyncio.Queue[Message | None], item: Message | None) -> bool:
    try:
        queue.put_nowait(item)
    except asyncio.QueueFull:
        return False
    return True


def _offer_end(queue: asyncio.Queue[Message | None]) -> None:
    with contextlib.suppress(asyncio.QueueEmpty):
        queue.get_nowait()
    _offer(queue, None)


async def watch(hub: StreamHub, job_id: int, last_event_id: str | None) -> AsyncIterator[bytes]:
    """The SSE body for one watcher: catch up from `last_event_id`, then follow the feed."""
    sent = Cursor.parse(last_event_id)
    queue = await hub.subscribe(job_id)  # before the catch-up: nothing falls between
    try:
        state = None
        while True:  # catch up from the database, once, page by page
            batch = await run_in_threadpool(hub._read, job_id, sent)
            for item in batch.messages:
                yield item.encode()
            sent = batch.cursor
            if batch.job is not None and batch.job.state != state:
                state = batch.job.state
                yield job_message(batch.job, sent, hub.paths).encode()
            if batch.more:
                continue
            if batch.job is None or batch.job.state in TERMINAL_STATES:
                yield end_message(batch.job, sent).encode()
                return
            break
        yield b"retry: 1000\n\n"
        while True:
            try:
                message: Message | None = await asyncio.wait_for(_get(queue), KEEPALIVE_S)
            except TimeoutError:
                yield b": keepalive\n\n"
                continue
            if message is None:  # feed gone or this watcher too slow: the client resumes
                return
            if message.kind == "job":
                if _state_of(message) == state and message.key != "refresh":
                    continue
                state = _state_of(message)
                yield Message("job", message.data, sent).encode()
            elif message.kind == "end":
                yield Message("end", message.data, sent).encode()
                return
            elif is_new(message, sent):
                sent = _advance(sent, message)
                yield Message(message.kind, message.data, sent).encode()
    finally:
        hub.unsubscribe(job_id, queue)


async def _get(queue: asyncio.Queue[Message | None]) -> Message | None:
    return await queue.get()


def _state_of(message: Message) -> str | None:
    return json.loads(message.data).get("state")


def _advance(sent: Cursor, message: Message) -> Cursor:
    if message.kind == "event":
        return replace(sent, event=message.key)
    if message.kind == "log":
        return replace(sent, log=message.key)
    return replace(sent, metric_time=message.key[0], metric_step=message.key[1])
