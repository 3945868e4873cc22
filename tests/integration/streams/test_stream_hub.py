"""The stream hub: many watchers of a job share one database feed."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine

from api.streams import StreamHub
from core.jobs import upserts
from core.platform.db import session_factory, session_scope
from core.platform.server_paths import ServerPaths


def test_many_watchers_of_a_job_share_one_feed_and_all_get_each_line(
    engine: Engine, job: dict[str, Any]
) -> None:
    async def scenario() -> tuple[int, list[list[int]], int]:
        hub = StreamHub(session_factory(engine), paths=ServerPaths(()), poll_s=0.2)
        queues = [await hub.subscribe(job["id"]) for _ in range(50)]
        feeds = len(hub.feeds)
        with session_scope(engine) as s:  # committed after every watcher joined
            points = [upserts.Metric("loss", step, 1.0 / step, 100.0 + step) for step in (1, 2)]
            upserts.metrics(session=s, job_id=job["id"], attempt=1, points=points)
        got: list[list[int]] = []
        for queue in queues:
            steps: list[int] = []
            while len(steps) < 2:
                message = await asyncio.wait_for(queue.get(), 30)
                assert message is not None
                if message.kind == "metric":
                    steps.append(message.key[1])
            got.append(steps)
        polls = hub.polls
        for queue in queues:
            hub.unsubscribe(job["id"], queue)
        await hub.close()
        return feeds, got, polls

    feeds, got, polls = asyncio.run(scenario())
    assert feeds == 1
    assert got == [[1, 2]] * 50
    # One read per tick serves all 50 watchers (50 reads would take 10 s at 0.2 s a tick).
    assert polls < 50
