"""`core.scheduling.preemption_policy.choose`: the table of who yields to whom."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from core.scheduling.preemption_policy import Choice, Holder, Waiting, choose


def waiting(
    id: int, priority: int, *, slots: int = 1, nodes: int = 1, project: str = "a"
) -> Waiting:
    return Waiting(id=id, project_id=project, priority=priority, slots=slots, nodes=nodes)


def holder(
    id: int,
    priority: int,
    *,
    on: Sequence[str] = ("w1",),
    slots: int = 1,
    ran_s: float = 600.0,
    project: str = "a",
    running: bool = True,
    leaving: bool = False,
) -> Holder:
    return Holder(
        id=id,
        project_id=project,
        priority=priority,
        slots=slots,
        workers=tuple(on),
        ran_s=ran_s,
        running=running,
        leaving=leaving,
    )


CASES: list[tuple[str, dict, dict[int, int], dict[int, tuple[int, ...]]]] = [
    (
        "full pool: the lower-priority job yields",
        {"waiting": [waiting(9, 50)], "holders": [holder(1, 0)], "free": {"w1": 0}},
        {1: 9},
        {9: (1,)},
    ),
    (
        "a free device: nobody yields",
        {"waiting": [waiting(9, 50)], "holders": [holder(1, 0)], "free": {"w1": 1}},
        {},
        {},
    ),
    (
        "equal priority never preempts",
        {"waiting": [waiting(9, 5)], "holders": [holder(1, 5)], "free": {"w1": 0}},
        {},
        {},
    ),
    (
        "higher-priority running job is kept",
        {"waiting": [waiting(9, 5)], "holders": [holder(1, 7)], "free": {"w1": 0}},
        {},
        {},
    ),
    (
        "the lowest priority of several yields",
        {
            "waiting": [waiting(9, 50)],
            "holders": [
                holder(1, 10, on=["w1"]),
                holder(2, 3, on=["w2"]),
                holder(3, 20, on=["w3"]),
            ],
            "free": {"w1": 0, "w2": 0, "w3": 0},
        },
        {2: 9},
        {9: (2,)},
    ),
    (
        "same priority: the most recently started yields",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0, on=["w1"], ran_s=900), holder(2, 0, on=["w2"], ran_s=100)],
            "free": {"w1": 0, "w2": 0},
        },
        {2: 9},
        {9: (2,)},
    ),
    (
        "too young to be preempted",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0, ran_s=30)],
            "free": {"w1": 0},
            "min_run_s": 60,
        },
        {},
        {},
    ),
    (
        "would still not fit: nothing is preempted",
        {
            "waiting": [waiting(9, 50, slots=4)],
            "holders": [holder(1, 0, slots=2), holder(2, 60, slots=2)],
            "free": {"w1": 0},
        },
        {},
        {},
    ),
    (
        "two victims on one worker make room for a larger job",
        {
            "waiting": [waiting(9, 50, slots=2)],
            "holders": [holder(1, 0), holder(2, 1), holder(3, 60)],
            "free": {"w1": 0},
        },
        {1: 9, 2: 9},
        {9: (1, 2)},
    ),
    (
        "free devices count: one victim is enough",
        {
            "waiting": [waiting(9, 50, slots=2)],
            "holders": [holder(1, 0), holder(2, 1)],
            "free": {"w1": 1},
        },
        {1: 9},
        {9: (1,)},
    ),
    (
        "a job already preempting makes room: no second victim",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0, running=False, leaving=True), holder(2, 0, on=["w2"])],
            "free": {"w1": 0, "w2": 0},
        },
        {},
        {9: (1,)},
    ),
    (
        "two waiting jobs: each gets its own victim, in claim order",
        {
            "waiting": [waiting(9, 50), waiting(10, 40)],
            "holders": [holder(1, 0, on=["w1"]), holder(2, 10, on=["w2"])],
            "free": {"w1": 0, "w2": 0},
        },
        {1: 9, 2: 10},
        {9: (1,), 10: (2,)},
    ),
    (
        "the second waiting job may not take the first's victim",
        {
            "waiting": [waiting(9, 50), waiting(10, 40)],
            "holders": [holder(1, 0)],
            "free": {"w1": 0},
        },
        {1: 9},
        {9: (1,)},
    ),
    (
        "a job that fits now takes the free device first",
        {
            "waiting": [waiting(8, 1), waiting(9, 50)],
            "holders": [holder(1, 0, on=["w1"])],
            "free": {"w1": 0, "w2": 1},
        },
        {1: 9},
        {9: (1,)},
    ),
    (
        "starting jobs are not preempted",
        {"waiting": [waiting(9, 50)], "holders": [holder(1, 0, running=False)], "free": {"w1": 0}},
        {},
        {},
    ),
    (
        "a job of a worker that is gone frees nothing usable",
        {"waiting": [waiting(9, 50)], "holders": [holder(1, 0, on=["gone"])], "free": {"w1": 0}},
        {},
        {},
    ),
    (
        "fair share: a victim of another project that would come back first is kept",
        {
            "waiting": [waiting(9, 50, project="b")],
            "holders": [
                holder(1, 0, on=["w1"], project="a"),
                holder(2, 0, on=["w2"], project="b"),
                holder(3, 0, on=["w3"], project="b"),
            ],
            "free": {"w1": 0, "w2": 0, "w3": 0},
        },
        {3: 9},
        {9: (3,)},
    ),
    (
        "fair share: another project's job with more slots yields",
        {
            "waiting": [waiting(9, 50, project="b")],
            "holders": [holder(1, 0, on=["w1"], project="a"), holder(2, 0, on=["w2"], project="a")],
            "free": {"w1": 0, "w2": 0},
        },
        {2: 9},
        {9: (2,)},
    ),
    (
        "a gang waits for a victim on each of two workers",
        {
            "waiting": [waiting(9, 50, nodes=2)],
            "holders": [holder(1, 0, on=["w1"]), holder(2, 5, on=["w2"]), holder(3, 90, on=["w3"])],
            "free": {"w1": 0, "w2": 0, "w3": 0},
        },
        {1: 9, 2: 9},
        {9: (1, 2)},
    ),
    (
        "a gang that cannot get enough workers preempts nothing",
        {
            "waiting": [waiting(9, 50, nodes=2)],
            "holders": [holder(1, 0, on=["w1"]), holder(2, 90, on=["w2"])],
            "free": {"w1": 0, "w2": 0},
        },
        {},
        {},
    ),
    (
        "a gang victim's devices on its other worker serve the next waiting job",
        {
            "waiting": [waiting(9, 50), waiting(10, 40)],
            "holders": [holder(1, 0, on=["w1", "w2"])],
            "free": {"w1": 0, "w2": 0},
        },
        {1: 9},
        {9: (1,), 10: (1,)},
    ),
    (
        "over its project's slot quota: the project's own lower-priority job yields",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 10, on=["w1"]), holder(2, 0, on=["w2"])],
            "free": {"w1": 0, "w2": 0},
            "quota_room": {"a": 0},
        },
        {2: 9},
        {9: (2,)},
    ),
    (
        "over its quota with a device free: its own job yields for the quota alone",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0)],
            "free": {"w1": 0, "w2": 1},
            "quota_room": {"a": 0},
        },
        {1: 9},
        {9: (1,)},
    ),
    (
        "over its quota: another project's job does not yield, it would not let it start",
        {
            "waiting": [waiting(9, 50, project="b")],
            "holders": [
                holder(1, 0, on=["w1"], project="a"),
                holder(2, 0, on=["w2"], project="a"),
                holder(3, 60, on=["w3"], project="b"),
            ],
            "free": {"w1": 0, "w2": 0, "w3": 0},
            "quota_room": {"b": 0},
        },
        {},
        {},
    ),
    (
        "over its quota with no own job of lower priority: nothing is preempted",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 60)],
            "free": {"w1": 1},
            "quota_room": {"a": 0},
        },
        {},
        {},
    ),
    (
        "an own job already leaving gives its quota back: no victim",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0, running=False, leaving=True), holder(2, 0, on=["w2"])],
            "free": {"w1": 0, "w2": 0},
            "quota_room": {"a": 0},
        },
        {},
        {9: (1,)},
    ),
    (
        "room under the quota: as without one",
        {
            "waiting": [waiting(9, 50, project="b")],
            "holders": [holder(1, 0, on=["w1"], project="a"), holder(2, 0, on=["w2"], project="a")],
            "free": {"w1": 0, "w2": 0},
            "quota_room": {"b": 1},
        },
        {2: 9},
        {9: (2,)},
    ),
    (
        "a gang over its quota takes its share from each node's room",
        {
            "waiting": [waiting(9, 50, nodes=2)],
            "holders": [holder(1, 0, on=["w1"]), holder(2, 5, on=["w2"]), holder(3, 9, on=["w2"])],
            "free": {"w1": 1, "w2": 1},
            "quota_room": {"a": 0},
        },
        {1: 9, 2: 9},
        {9: (1, 2)},
    ),
    (
        "the second waiting job of a capped project does not count its first's room twice",
        {
            "waiting": [waiting(9, 50), waiting(10, 40)],
            "holders": [holder(1, 0)],
            "free": {"w1": 0, "w2": 1},
            "quota_room": {"a": 0},
        },
        {1: 9},
        {9: (1,)},
    ),
    (
        "at its running-jobs limit with devices free: its own lower-priority job yields",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 10, on=["w1"]), holder(2, 0, on=["w2"])],
            "free": {"w1": 0, "w2": 0, "w3": 1},
            "jobs_room": {"a": 0},
        },
        {2: 9},
        {9: (2,)},
    ),
    (
        "at its running-jobs limit: another project's job does not yield",
        {
            "waiting": [waiting(9, 50, project="b")],
            "holders": [
                holder(1, 0, on=["w1"], project="a"),
                holder(2, 60, on=["w2"], project="b"),
            ],
            "free": {"w1": 0, "w2": 0},
            "jobs_room": {"b": 0},
        },
        {},
        {},
    ),
    (
        "at its running-jobs limit with an own job leaving: it waits for that one, no victim",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0, running=False, leaving=True), holder(2, 0, on=["w2"])],
            "free": {"w1": 0, "w2": 0},
            "jobs_room": {"a": 0},
        },
        {},
        {9: (1,)},
    ),
    (
        "under both limits after one victim: one job yields for devices, limit and slots",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0, on=["w1"]), holder(2, 5, on=["w1"])],
            "free": {"w1": 0},
            "quota_room": {"a": 0},
            "jobs_room": {"a": 0},
        },
        {1: 9},
        {9: (1,)},
    ),
    (
        "two over its running-jobs limit: two own jobs yield though one frees the devices",
        {
            "waiting": [waiting(9, 50)],
            "holders": [holder(1, 0, on=["w1"]), holder(2, 5, on=["w1"]), holder(3, 60, on=["w2"])],
            "free": {"w1": 0, "w2": 0},
            "jobs_room": {"a": -1},
        },
        {1: 9, 2: 9},
        {9: (1, 2)},
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "victims", "waits"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_choose(kwargs: dict, victims: dict[int, int], waits: dict[int, tuple[int, ...]]) -> None:
    assert choose(**kwargs) == Choice(victims=victims, waits=waits)


def test_weights_scale_the_fair_share() -> None:
    """Project a holds 2 slots, b 1 and waits with priority 50. At weight 1 each, b's share (1)
    is no more than a's once one of its jobs yielded (1): a's lowest-priority job yields. At
    weight 4 for a, a would come back first (0.25 < 1): b's own job (priority 10) yields."""
    kwargs: dict = {
        "waiting": [waiting(9, 50, project="b")],
        "holders": [
            holder(1, 0, on=["w1"], project="a"),
            holder(2, 0, on=["w2"], project="a"),
            holder(3, 10, on=["w3"], project="b"),
        ],
        "free": {"w1": 0, "w2": 0, "w3": 0},
    }
    assert choose(**kwargs).victims == {2: 9}
    assert choose(**kwargs, weights={"a": 4.0}).victims == {3: 9}
    assert choose(**kwargs, weights={"b": 4.0}).victims == {2: 9}
