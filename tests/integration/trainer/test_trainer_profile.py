"""`train.profile`: the profiler records exactly the asked steps of a real training loop and
writes a Chrome trace and a summary next to the checkpoints (CPU here; CUDA adds kernels)."""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

import pytest

from tests.support.training import build_local_run, tiny_spec
from trainer.loop import train_loop
from trainer.profiling import _union_ms


def test_profile_window_writes_trace_and_summary(
    tmp_path: Path, corpus_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = tiny_spec(
        corpus_dir,
        train={"max_steps": 6, "profile": {"start_step": 3, "num_steps": 2}},
        eval={"interval_steps": 6, "num_batches": 1},
        checkpoint={"interval_steps": 6, "keep_last": 1},
        sample={"max_new_tokens": 0},
    )
    run = build_local_run(spec, tmp_path / "ckpt")
    assert run.profiler is not None
    with caplog.at_level(logging.INFO, logger="trainer.profiling"):
        train_loop(run)
        run.profiler.close()
    out = tmp_path / "ckpt" / "profile"
    trace = json.loads(gzip.decompress((out / "rank0.json.gz").read_bytes()))
    steps = {
        int(m.group(1))
        for e in trace["traceEvents"]
        if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", ""))))
    }
    assert steps == {2, 3}  # 0-based: the attempt's 3rd and 4th optimizer steps
    summary = json.loads((out / "rank0.summary.json").read_text())
    assert summary["steps"] == 2 and summary["device"] == "cpu"
    assert summary["step_ms"] > 0
    names = [k["name"] for k in summary["top_kernels"]]
    assert any(name.startswith("aten::") for name in names)
    assert "profile rank 0:" in caplog.text


def test_union_counts_overlaps_once() -> None:
    # [0, 10) and [5, 20) overlap; [30, 40) is apart; [32, 35) is inside it: 20 + 10 us.
    assert _union_ms([(30, 40), (0, 10), (5, 20), (32, 35)]) == pytest.approx(0.030)
    assert _union_ms([]) == 0.0
