"""Priority preemption: which running jobs yield their devices to a queued job of higher
priority that cannot start because its pool is full. Pure: `choose` takes plain facts and
returns the victims; `core.scheduling.preemption_apply` reads the facts from the database and
applies them.

A queued job `W` (in claim order, `core.scheduling.claim`) that fits the free devices of the pool's
live workers needs nothing: a claim takes it. One that does not fit is given room on a worker
by, first, the devices that leaving jobs (cancelling, pausing, preempting) are about to free
there, then by running jobs of the same pool that

- have a lower priority than `W` (never equal or higher),
- have run for at least `min_run_s` seconds in their current attempt (no thrash),
- and, of another project, would not come back ahead of `W` in the claim order: fair share
  serves the project with the fewest active slots per weight first, so a victim is taken only
  where `W`'s project holds no more per weight than the victim's project will once it yielded.

Victims are taken on a worker lowest priority first, then the most recently started (least
work since its last checkpoint at risk), until `W`'s node fits. A multi-node `W` gets the
`nodes` workers where room is cheapest (no new victim, then the lowest victim priority, then
the fewest devices taken). When `W` would still not fit after every eligible victim yielded,
nothing is preempted for it. The devices handed to one waiting job are not handed to the
next one of the same pass.

A project's slot quota (`core.scheduling.quotas`, `quota gpus 2/2`) is a pool of its own: a waiting
job whose project holds its whole quota cannot start however many devices the pool frees. It takes
victims of its own project only (lower priority, as above) until its project is back under the quota
and its node fits, so priority within a project holds under a cap; another project's jobs never
yield to it. The devices of its project's leaving jobs count as given back. A gang over its quota
needs an equal share of what its project must give back from each node's room. A running-jobs limit
(`quota running jobs 3/3`) is the same with jobs for devices: each victim of its project, and each
of its leaving jobs, gives back one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Waiting:
    """A queued job: `slots` devices on each of `nodes` distinct workers."""

    id: int
    project_id: str
    priority: int
    slots: int
    nodes: int = 1

    @property
    def size(self) -> int:
        return self.slots * self.nodes


@dataclass(frozen=True)
class Holder:
    """An active job of the pool holding `slots` devices on each worker of `workers` (one per
    node). `ran_s`: seconds since its current attempt was claimed. `running`: its trainer runs
    (it may be preempted); `leaving`: it is cancelling, pausing or preempting (its devices are
    freed soon). Neither: starting."""

    id: int
    project_id: str
    priority: int
    slots: int
    workers: tuple[str, ...]
    ran_s: float = 0.0
    running: bool = True
    leaving: bool = False

    @property
    def size(self) -> int:
        return self.slots * len(self.workers)


@dataclass
class Choice:
    """`victims`: {running job id: the waiting job id it yields to}; `waits`: {waiting job id:
    the leaving jobs (new victims and jobs already leaving) whose devices it waits for}."""

    victims: dict[int, int] = field(default_factory=dict)
    waits: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Room:
    """Room for one node on `worker`: the leaving jobs and new victims it takes."""

    worker: str
    leaving: tuple[Holder, ...]
    victims: tuple[Holder, ...]
    gained: int

    @property
    def cost(self) -> tuple[bool, int, int, float, int]:
        """Cheapest first: no new victim, the lowest victim priority, the fewest devices
        taken, then (as on one worker) the most recently started, the newest."""
        if not self.victims:
            return (False, 0, 0, 0.0, 0)
        top = max(v.priority for v in self.victims)
        slots = sum(v.slots for v in self.victims)
        return (
            True,
            top,
            slots,
            max(v.ran_s for v in self.victims),
            -max(v.id for v in self.victims),
        )


class _Pass:
    """The state of one `choose`: free and soon-free devices, active slots per project."""

    def __init__(
        self,
        holders: Sequence[Holder],
        free: Mapping[str, int],
        weights: Mapping[str, float],
        min_run_s: float,
        quota_room: Mapping[str, int],
        jobs_room: Mapping[str, int],
    ) -> None:
        self.free = dict(free)
        self.weights = weights
        self.min_run_s = min_run_s
        self.quota = dict(quota_room)
        self.jobs = dict(jobs_room)
        self.leaving: dict[str, list[Holder]] = {}
        self.candidates: dict[str, list[Holder]] = {}
        self.use: dict[str, int] = {}
        for h in holders:
            if h.leaving:
                self._give_back(h)
                for w in h.workers:
                    self.leaving.setdefault(w, []).append(h)
                continue
            self.use[h.project_id] = self.use.get(h.project_id, 0) + h.size
            if h.running:
                for w in h.workers:
                    self.candidates.setdefault(w, []).append(h)
        self.choice = Choice()

    def share(self, project_id: str, less: int = 0) -> float:
        weight = self.weights.get(project_id, 1.0)
        return (self.use.get(project_id, 0) - less) / (weight if weight > 0 else 1.0)

    def over_quota(self, job: Waiting) -> int:
        """Devices `job`'s project must give back before the job fits its slot quota (0 or
        less: it fits, or there is no quota)."""
        room = self.quota.get(job.project_id)
        return 0 if room is None else job.size - room

    def over_jobs(self, job: Waiting) -> int:
        """Active jobs `job`'s project must give back before the job fits its running-jobs
        limit (0 or less: it fits, or there is no limit)."""
        room = self.jobs.get(job.project_id)
        return 0 if room is None else 1 - room

    def _give_back(self, holder: Holder) -> None:
        if holder.project_id in self.quota:
            self.quota[holder.project_id] += holder.size
        if holder.project_id in self.jobs:
            self.jobs[holder.project_id] += 1

    def _hold(self, job: Waiting) -> None:
        self.use[job.project_id] = self.use.get(job.project_id, 0) + job.size
        if job.project_id in self.quota:
            self.quota[job.project_id] -= job.size
        if job.project_id in self.jobs:
            self.jobs[job.project_id] -= 1

    def eligible(self, victim: Holder, job: Waiting) -> bool:
        if victim.priority >= job.priority or victim.ran_s < self.min_run_s:
            return False
        if victim.project_id == job.project_id:
            return True
        if self.over_quota(job) > 0 or self.over_jobs(job) > 0:  # another project's would not
            return False  # let it start
        return self.share(job.project_id) <= self.share(victim.project_id, less=victim.size)

    def room(self, worker: str, job: Waiting) -> _Room | None:
        """Room for one node of `job` on `worker`, or None when even every eligible victim
        there would leave too little, of devices or (over its quota) of its project's share."""
        need = job.slots - self.free[worker]
        give_back = -(-self.over_quota(job) // job.nodes)  # this node's share, rounded up
        jobs_back = -(-self.over_jobs(job) // job.nodes)
        leaving: list[Holder] = []
        for h in self.leaving.get(worker, []):
            if need <= 0:
                break
            leaving.append(h)
            need -= h.slots
        victims: list[Holder] = []
        ranked = sorted(
            (v for v in self.candidates.get(worker, []) if self.eligible(v, job)),
            key=lambda v: (v.priority, v.ran_s, -v.id),
        )
        for v in ranked:
            if need <= 0 and give_back <= 0 and jobs_back <= 0:
                break
            victims.append(v)
            need -= v.slots
            give_back -= v.size  # over its quota, every victim is of its own project
            jobs_back -= 1
        if need > 0 or give_back > 0 or jobs_back > 0:
            return None
        gained = sum(h.slots for h in leaving) + sum(v.slots for v in victims)
        return _Room(worker, tuple(leaving), tuple(victims), gained)

    def take(self, job: Waiting, rooms: Sequence[_Room]) -> None:
        """Give `job` the rooms: their leaving jobs and victims go, their devices are its."""
        waits: list[int] = []
        for room in rooms:
            for h in room.leaving:
                self._drop(h)
                waits.append(h.id)
            for v in room.victims:
                self.choice.victims[v.id] = job.id
                self.use[v.project_id] = self.use.get(v.project_id, 0) - v.size
                self._give_back(v)
                self._drop(v)
                waits.append(v.id)
                for other in v.workers:  # a gang victim frees devices elsewhere too
                    if other != room.worker and other in self.free:
                        self.leaving.setdefault(other, []).append(v)
            self.free[room.worker] += room.gained - job.slots
        self._hold(job)
        self.choice.waits[job.id] = tuple(dict.fromkeys(waits))

    def _drop(self, holder: Holder) -> None:
        for lists in (self.leaving, self.candidates):
            for w in holder.workers:
                if holder in lists.get(w, []):
                    lists[w].remove(holder)

    def fit_now(self, job: Waiting) -> bool:
        if self.over_quota(job) > 0 or self.over_jobs(job) > 0:
            return False
        fitting = sorted(
            (w for w, f in self.free.items() if f >= job.slots), key=lambda w: (self.free[w], w)
        )
        if len(fitting) < job.nodes:
            return False
        for w in fitting[: job.nodes]:
            self.free[w] -= job.slots
        self._hold(job)
        return True


def choose(
    *,
    waiting: Sequence[Waiting],
    holders: Sequence[Holder],
    free: Mapping[str, int],
    weights: Mapping[str, float] | None = None,
    min_run_s: float = 0.0,
    quota_room: Mapping[str, int] | None = None,
    jobs_room: Mapping[str, int] | None = None,
) -> Choice:
    """The running jobs to preempt, and for whom (module docstring).

    `waiting`: the pool's queued jobs within their quotas but for the slot quotas, in claim
    order; `holders`: the pool's active jobs; `free`: {live worker of the pool: devices free
    now}; `weights`: {project: fair-share weight} (default 1); `min_run_s`: seconds a job runs
    before it may be preempted; `quota_room`: {project: devices its active jobs may still add
    on the pool under its slot quotas (negative when over them)}, none for a project without
    one; `jobs_room`: {project: jobs it may still start under its running-jobs limits}, the
    same way. Pure.
    """
    state = _Pass(holders, free, weights or {}, min_run_s, quota_room or {}, jobs_room or {})
    for job in waiting:
        if state.fit_now(job):
            continue
        rooms = [r for w in sorted(state.free) if (r := state.room(w, job)) is not None]
        if len(rooms) < job.nodes:
            continue
        rooms.sort(key=lambda r: (r.cost, r.worker))
        chosen = _distinct(rooms, job.nodes)
        if len(chosen) == job.nodes:
            state.take(job, chosen)
    return state.choice


def _distinct(rooms: list[_Room], nodes: int) -> list[_Room]:
    """The `nodes` cheapest rooms (fewer when too few are left): rooms are computed per
    worker, so one that shares a victim or a leaving job with a cheaper one is left out."""
    chosen: list[_Room] = []
    used: set[int] = set()
    for room in rooms:
        ids = {h.id for h in (*room.leaving, *room.victims)}
        if ids & used:
            continue
        chosen.append(room)
        used |= ids
        if len(chosen) == nodes:
            break
    return chosen
