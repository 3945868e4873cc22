"""How a worker reads a launched trainer's output and judges how the attempt ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.ingest import rank_exit_code
from workers.launcher import RunPaths
from workers.outcome import ExitCause, Verdict, classify, retryable, verdict
from workers.tail import FileTail


@pytest.mark.parametrize(
    ("returncode", "completed", "state", "shutdown", "left", "expected"),
    [
        (0, True, "running", False, 0, Verdict.SUCCEEDED),
        (0, True, "cancelling", False, 0, Verdict.SUCCEEDED),  # it finished before the signal
        (1, False, "cancelling", False, 3, Verdict.CANCELLED),
        (0, False, "running", True, 0, Verdict.HAND_BACK),  # shutdown ignores the retry budget
        (1, False, "running", False, 1, Verdict.RESTART),
        (-9, False, "starting", False, 1, Verdict.FAILED),  # SIGKILL: the OOM killer
        (-15, False, "starting", False, 1, Verdict.RESTART),  # another signal
        (1, False, "pausing", False, 0, Verdict.PAUSED),
        (0, True, "pausing", False, 0, Verdict.SUCCEEDED),
        (1, False, "running", False, 0, Verdict.FAILED),
        (2, False, "running", False, 5, Verdict.FAILED),  # invalid spec/data: never retried
        (0, False, "running", False, 0, Verdict.FAILED),  # exit 0 without `completed`
        (1, True, "running", False, 0, Verdict.FAILED),  # `completed` but a crash after it
    ],
)
def test_verdict(
    returncode: int, completed: bool, state: str, shutdown: bool, left: int, expected: Verdict
) -> None:
    assert (
        verdict(
            returncode=returncode,
            completed=completed,
            state=state,
            shutdown=shutdown,
            restarts_left=left,
        )
        is expected
    )


@pytest.mark.parametrize(
    ("returncode", "output", "expected"),
    [
        (2, "CUDA out of memory", ExitCause.SPEC_ERROR),  # the trainer's verdict comes first
        (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
        (1, "RuntimeError: DefaultCPUAllocator: can't allocate memory", "oom"),
        (-9, "", ExitCause.OOM),
        (137, "", ExitCause.OOM),
        (
            1,
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(...)",
            "collective_timeout",
        ),
        (
            1,
            "RuntimeError: [../third_party/gloo/...] Timed out waiting 1800000ms",
            "collective_timeout",
        ),
        (1, "torch.distributed.DistNetworkError: Connection reset by peer", "collective_timeout"),
        (-15, "", ExitCause.SIGNAL),
        (1, "ValueError: boom", ExitCause.ERROR),
    ],
)
def test_classify_names_the_cause_of_a_failed_attempt(
    returncode: int, output: str, expected: str
) -> None:
    assert classify(returncode, output) == expected


def test_retry_policy_by_cause() -> None:
    assert not retryable(ExitCause.SPEC_ERROR, retry_oom=True)
    assert not retryable(ExitCause.MAX_RUNTIME, retry_oom=True)
    assert not retryable(ExitCause.OOM, retry_oom=False)
    assert retryable(ExitCause.OOM, retry_oom=True)
    for cause in (ExitCause.SIGNAL, ExitCause.COLLECTIVE_TIMEOUT, ExitCause.WORKER_LOST):
        assert retryable(cause, retry_oom=False)
    oom = verdict(
        returncode=1, completed=False, state="running", shutdown=False, restarts_left=3,
        cause=ExitCause.OOM, retry_oom=True,
    )  # fmt: skip
    assert oom is Verdict.RESTART


def test_tail_returns_complete_lines_with_their_byte_offsets(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    tail = FileTail(path)
    assert tail.read().lines == []  # not created yet
    path.write_bytes(b"one\r\ntwo\nthr")
    chunk = tail.read()
    assert chunk.lines == [(0, b"one"), (5, b"two")]
    assert tail.read().lines == chunk.lines  # nothing moves until advance()
    tail.advance(chunk)
    with path.open("ab") as f:
        f.write(b"ee\nfour")
    chunk = tail.read()
    assert chunk.lines == [(9, b"three")]
    tail.advance(chunk)
    final = tail.read(final=True)
    assert final.lines == [(15, b"four")]
    tail.advance(final)
    assert tail.read(final=True).lines == []


def test_tail_reads_in_bounded_chunks_and_splits_a_runaway_line(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(b"a" * 10 + b"\nbb\n")
    tail = FileTail(path)
    chunk = tail.read(max_bytes=4)
    assert chunk.lines == [(0, b"aaaa")]
    tail.advance(chunk)
    chunk = tail.read(max_bytes=8)
    assert chunk.lines == [(4, b"aaaaaa")]
    tail.advance(chunk)
    assert tail.read(max_bytes=8).lines == [(11, b"bb")]


TORCHRUN_FAILURE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
trainer FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_01:54:18
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 20238)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_01:54:18
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 20237)
  error_file: <N/A>
============================================================
"""


def test_rank_exit_code_is_the_root_cause_in_torchruns_report(tmp_path: Path) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="c", data="d")
    assert rank_exit_code(paths) is None  # torchrun wrote nothing (yet)
    paths.launcher_log("stderr").write_text("some warning\n")
    assert rank_exit_code(paths) is None
    paths.launcher_log("stderr").write_text("some warning\n" + TORCHRUN_FAILURE)
    assert rank_exit_code(paths) == 2
