"""Two ranks under torchrun: local rank 0 builds the cache entry while rank 1 waits, both
memory-map the same entry; a data error on the builder reaches the waiting rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobspec.job import JobSpec
from tests.support.sft_data import messages_records, write_jsonl

ROOT = Path(__file__).resolve().parents[3]


def _run(tmp_path: Path, seq_len: int = 2048, **data: object) -> list[dict[str, object]]:
    corpus = write_jsonl(tmp_path / "chat.jsonl", messages_records(20))
    spec = JobSpec.model_validate(
        {"name": "x", "model": {"seq_len": seq_len},
         "data": {"uri": str(corpus), "max_truncated_share": 0.5, **data}}
    )  # fmt: skip
    spec.dump(tmp_path / "spec.json")
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(ROOT / "tests/support/dataprep_ranks.py"),
        str(tmp_path / "spec.json"), str(tmp_path / "cache"), str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=120, env={"OMP_NUM_THREADS": "1",
                   **_env()})  # fmt: skip
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {
        "PYTHONPATH": str(ROOT)
    }


@pytest.mark.timeout(180)
def test_both_ranks_map_the_entry_local_rank_zero_built(tmp_path: Path) -> None:
    rank0, rank1 = _run(tmp_path, eval_fraction=0.2)
    assert rank0["entry"] == rank1["entry"] and rank0["rows"] == rank1["rows"]
    entries = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert [str(p) for p in entries] == [rank0["entry"]]


@pytest.mark.timeout(180)
def test_a_data_error_on_the_builder_reaches_the_waiting_rank(tmp_path: Path) -> None:
    rank0, rank1 = _run(tmp_path, seq_len=64, truncation="truncate_right")
    assert "lose every supervised token" in str(rank0["invalid"])
    assert "another rank" in str(rank1["invalid"])
