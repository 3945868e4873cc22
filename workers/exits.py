"""How a node's ranks ended, from what they recorded: never from torchrun's printed report.

Two structured sources, both in the node's run dir:

- the trainer's own `error` event in `events.jsonl` (docs/CONTRACTS.md section 2): its
  message, exit code (2: invalid spec or data) and `failure_class`, classified by the trainer
  from the exception object itself (`dataformat.failures.classify_exception`). Only the
  reporting rank writes events.
- torchrun's per-rank error files: the trainer's `main` is decorated with
  `torch.distributed.elastic.multiprocessing.errors.record`, so an exception leaving any rank
  is written to `TORCHELASTIC_ERROR_FILE`, which torchrun sets per rank under its `--log-dir`:
  `LOG_DIR/<rdzv_id>_<random>/attempt_<restart>/<local_rank>/error.json`, JSON
  `{"message": {"message": "<Type>: <text>", "extraInfo": {"py_callstack", "timestamp"}}}`.

The first failed rank is the one whose error file was written first (its mtime; on a tie a
distributed error, usually the echo of a peer's death, comes after the others). A rank that
left no exception behind (killed by a signal, `os._exit`, a crash in native code) is `infra`,
or `oom` when the kernel's OOM killer struck this worker's cgroup during the attempt (the
`oom_kill` counter of cgroup v2 `memory.events`, or v1 `memory.oom_control`, rose).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from core.attempts.lifecycle_policy import Failure, NodeEnd, Stop
from dataformat.failures import PEER_LOST_MESSAGES, FailureClass, classify, error_type_names
from workers.ingest import last_lines, stderr_tail
from workers.isolation.cgroups import JobCgroup
from workers.launcher import RunPaths
from workers.supervisor import Exit

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 20
MAX_REASON_CHARS = 300
CGROUP_ROOT = Path("/sys/fs/cgroup")
OOM_KILLED = "a rank was killed by the kernel's OOM killer (oom_kill rose in the worker's cgroup)"


@dataclass(frozen=True)
class RankError:
    """One rank's `error.json`: `at` is when it was written (unix seconds, the file's mtime)."""

    local_rank: int
    message: str
    callstack: str
    at: float


@dataclass(frozen=True)
class TrainerError:
    """The trainer's `error` event (the reporting rank's exception)."""

    message: str
    exit_code: int
    failure_class: FailureClass | None
    rank: int | None


def last_restart(paths: RunPaths) -> int:
    """torchrun's last in-place restart of the worker group (0 before any): the run that
    ended the attempt."""
    restarts = [
        int(p.name.removeprefix("attempt_"))
        for p in paths.log_dir.glob("*/attempt_*")
        if p.name.removeprefix("attempt_").isdigit()
    ]
    return max(restarts, default=0)


def rank_errors(paths: RunPaths, restart: int) -> list[RankError]:
    """The error files of torchrun's run `restart` of this node's worker group, in the order
    they were written. An unreadable or foreign file is skipped (logged)."""
    found: list[RankError] = []
    for path in paths.log_dir.glob(f"*/attempt_{restart}/*/error.json"):
        if not path.parent.name.isdigit():
            continue
        try:
            data = json.loads(path.read_text(errors="replace"))
            body = data["message"]
            message = body if isinstance(body, str) else str(body["message"])
            extra = {} if isinstance(body, str) else body.get("extraInfo") or {}
            at = path.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("unreadable error file %s", path)
            continue
        callstack = str(extra.get("py_callstack") or "")
        found.append(RankError(int(path.parent.name), message, callstack, at))
    return sorted(found, key=lambda e: (e.at, _class_of(e) is FailureClass.INFRA, e.local_rank))


def trainer_error(paths: RunPaths, restart: int) -> TrainerError | None:
    """The last `error` event the trainer wrote in run `restart` of the worker group."""
    found: TrainerError | None = None
    try:
        raw = paths.events.read_bytes()
    except FileNotFoundError:
        return None
    for line in raw.splitlines():
        if b'"error"' not in line:
            continue
        try:
            event: dict[str, Any] = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if event.get("type") != "error" or int(event.get("restart") or 0) != restart:
            continue
        cls = event.get("failure_class")
        found = TrainerError(
            message=str(event.get("message", "")),
            exit_code=int(event.get("exit_code") or 1),
            failure_class=FailureClass(cls) if cls in set(FailureClass) else None,
            rank=event.get("rank") if isinstance(event.get("rank"), int) else None,
        )
    return found


def _class_of(error: RankError) -> FailureClass:
    names, errno = error_type_names(error.message)
    return classify(names, error.message, errno)


def oom_kills(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> int | None:
    """How often the kernel's OOM killer has killed a process of this process's cgroup (the
    trainer runs in the worker's): `oom_kill` of cgroup v2 `memory.events`, else of v1
    `memory.oom_control`. None when no counter can be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            candidates.append(root / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):  # cgroup v1
            candidates.append(root / "memory" / path.lstrip("/") / "memory.oom_control")
    for file in candidates:
        try:
            for entry in file.read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        except OSError:
            continue
    return None


_WORKER_COUNTER = oom_kills


def oom_counter(group: JobCgroup | None) -> Callable[[], int | None]:
    """What counts this node's OOM kills: its own cgroup's counter plus the worker's (a limit
    above the job's, the worker's container, counts its kills there: cgroup v1's `oom_kill`
    is not hierarchical), or the worker's alone without a group. None when neither is read."""
    if group is None:
        return oom_kills

    def both() -> int | None:
        counts = [c for c in (group.oom_kills(), oom_kills()) if c is not None]
        return sum(counts) if counts else None

    return both


def node_failure(
    *,
    paths: RunPaths,
    returncode: int,
    node_rank: int,
    nproc: int,
    host: str | None,
    oom_kills_before: int | None = None,
    oom_kills_after: int | None = None,
    plain_command: bool = False,
    single_rank: bool = False,
) -> Failure:
    """How this node failed, its torchrun having exited `returncode` (non-zero) by itself.
    `single_rank`: the node ran its one rank without torchrun
    (`workers.lone_rank`): `returncode` is the rank's own (-N: killed by signal N).

    `nproc`: ranks on this node; a rank is numbered `node_rank * nproc + local_rank`, as its
    stored log lines are. `oom_kills_*`: `oom_kills()` at launch and now (evidence for `oom`
    when a rank died without an exception). `plain_command`: an entrypoint job's command that
    the runner does not wrap (`bash run.sh`, `python -c ...`), which records no exception: a
    rank that exits non-zero leaving nothing behind gave its own answer (`user_error`, unless
    the OOM killer struck). A rank the trainer or the runner (`torchyard.train`) ran would have
    recorded its exception or non-zero exit: leaving nothing means a signal or a hard exit
    (`infra`).
    """
    restart = last_restart(paths)
    errors = rank_errors(paths, restart)
    event = trainer_error(paths, restart)
    base = node_rank * nproc
    oom = (
        oom_kills_before is not None
        and oom_kills_after is not None
        and oom_kills_after > oom_kills_before
    )
    if errors:
        first = errors[0]
        rank = base + first.local_rank
        if event is not None and event.message == first.message and event.failure_class:
            cls, code = event.failure_class, event.exit_code
        else:
            cls, code = _class_of(first), returncode
        if oom and any(m in first.message for m in PEER_LOST_MESSAGES):
            # A surviving rank's echo of a lost peer; the peer left no exception because the
            # kernel's OOM killer SIGKILLed it (which rank that was, nothing recorded).
            return Failure(
                failure_class=FailureClass.OOM,
                reason=f"{OOM_KILLED}; rank {rank}: {_one_line(first.message)}",
                node_rank=node_rank,
                host=host,
                exit_code=returncode,
                log_tail=_tail(paths, restart, None),
            )
        return Failure(
            failure_class=cls,
            reason=_one_line(first.message),
            rank=rank,
            node_rank=node_rank,
            host=host,
            exit_code=code,
            log_tail=_tail(paths, restart, first.local_rank),
        )
    if event is not None:  # exit 2 (SystemExit): no error file, only the trainer's word
        local = None if event.rank is None else event.rank - base
        local = local if local is not None and 0 <= local < nproc else None
        return Failure(
            failure_class=event.failure_class or FailureClass.USER_ERROR,
            reason=_one_line(event.message),
            rank=event.rank,
            node_rank=node_rank,
            host=host,
            exit_code=event.exit_code,
            log_tail=_tail(paths, restart, local),
        )
    if oom:
        cls, reason = FailureClass.OOM, OOM_KILLED
    elif plain_command:
        cls = FailureClass.USER_ERROR
        reason = (
            "a rank exited non-zero without recording an exception; "
            f"{_launch_exit(returncode, single_rank)}"
        )
    else:
        cls = FailureClass.INFRA
        reason = (
            "a rank exited without recording an exception (a signal or a hard exit); "
            f"{_launch_exit(returncode, single_rank)}"
        )
    return Failure(
        failure_class=cls,
        reason=reason,
        node_rank=node_rank,
        host=host,
        exit_code=returncode,
        log_tail=_tail(paths, restart, None),
    )


def _launch_exit(returncode: int, single_rank: bool) -> str:
    """How the node's launch ended, in words: torchrun's exit code, or the rank's own exit
    (its signal by name) when it ran without torchrun."""
    if not single_rank:
        return f"torchrun exited {returncode}"
    if returncode < 0:
        try:
            return f"the rank was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"the rank was killed by signal {-returncode}"
    return f"the rank exited {returncode}"


def _one_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


def log_tail(paths: RunPaths) -> tuple[str, ...]:
    """The last stderr lines of the rank that best explains how the node's last run ended."""
    return _tail(paths, last_restart(paths), None)


def _tail(paths: RunPaths, restart: int, local_rank: int | None) -> tuple[str, ...]:
    """The last stderr lines of `local_rank` in run `restart`, else of the rank whose stderr
    best explains the failure (`workers.ingest.stderr_tail`)."""
    if local_rank is not None:
        path = paths.rank_logs().get((restart, local_rank, "stderr"))
        lines = last_lines(path, LOG_TAIL_LINES) if path is not None else []
        if lines:
            return tuple(lines)
    found = stderr_tail(paths, LOG_TAIL_LINES)
    return () if found is None else tuple(found[1])


@dataclass(frozen=True)
class NodeRun:
    """Where a node's exit facts are: its run dir, its place in the gang (`nproc` ranks per
    node), and `oom_kills()` when its torchrun was launched."""

    paths: RunPaths
    node_rank: int
    nproc: int
    oom_kills: int | None
    plain_command: bool = False  # an entrypoint command the runner does not wrap (node_failure)
    single_rank: bool = False  # its one rank ran without torchrun (node_failure)
    hints: tuple[str, ...] = ()  # what the launch noticed (`Failure.hints`), on its failure
    oom_counter: Callable[[], int | None] = _WORKER_COUNTER  # read at the end (`oom_counter`)


def node_end(end: Exit, facts: NodeRun) -> NodeEnd:
    """This node's `NodeEnd` from its torchrun's `Exit` and the ranks' recorded exits.

    A node failed when its torchrun exited non-zero without the worker stopping it
    (`workers.exits.node_failure` says how), or when a watcher stopped it for a hang.
    """
    code, failure = end.returncode, None
    host = socket.gethostname()
    if end.stop is Stop.HANG:
        failure = Failure(
            FailureClass.HANG,
            reason=end.stop_reason or "no step progress within the hang timeout",
            node_rank=facts.node_rank,
            host=host,
            exit_code=end.returncode,
            log_tail=log_tail(facts.paths),
        )
    elif end.stop is None and end.returncode != 0:
        failure = node_failure(
            paths=facts.paths,
            returncode=end.returncode,
            node_rank=facts.node_rank,
            nproc=facts.nproc,
            host=host,
            oom_kills_before=facts.oom_kills,
            oom_kills_after=facts.oom_counter(),
            plain_command=facts.plain_command,
            single_rank=facts.single_rank,
        )
        code = end.returncode if failure.exit_code is None else failure.exit_code
    if failure is not None and facts.hints:
        failure = dataclasses.replace(failure, hints=facts.hints)
    return NodeEnd(
        node_rank=facts.node_rank,
        exit_code=code,
        stop=end.stop,
        completed=end.reported.completed is not None,
        failure=failure,
        runtime_s=end.runtime_s,
    )
