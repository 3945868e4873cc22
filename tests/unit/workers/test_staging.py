"""`workers.entrypoint.staging.CheckpointSync` from local staging directories to fsspec's in-memory
filesystem, which stands in for the bucket (tests/integration/storage runs it against a real S3
server): a single node's checkpoint, and a checkpoint whose parts several nodes stage."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import fsspec
import pytest

from workers.entrypoint.staging import COMPLETE_MARKER, CheckpointSync, part_marker


def stage(staging: Path, step: int, files: dict[str, bytes], *, complete: bool) -> Path:
    """A checkpoint directory as a program leaves it in `staging` (rank 0 adds the marker)."""
    path = staging / f"step_{step:08d}"
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    if complete:
        (path / COMPLETE_MARKER).write_text("")
    return path


@pytest.fixture
def bucket() -> str:
    return f"memory://bucket-{secrets.token_hex(4)}/jobs/7/checkpoints"


def sync(tmp_path: Path, bucket: str, node: int, nnodes: int, **more: Any) -> CheckpointSync:
    return CheckpointSync(
        job_id=7,
        staging=tmp_path / f"host{node}" / "staging",
        remote=bucket,
        attempt=2,
        node_rank=node,
        nnodes=nnodes,
        **more,
    )


def names(uri: str) -> set[str]:
    fs, root = fsspec.core.url_to_fs(uri)
    return {path[len(root.rstrip("/")) + 1 :] for path in fs.find(root)}


def test_a_single_nodes_checkpoint_is_uploaded_whole_and_its_event_names_the_bucket(
    tmp_path: Path, bucket: str
) -> None:
    one = sync(tmp_path, bucket, 0, 1)
    local = stage(one.staging, 5, {"model.pt": b"w", "opt/state.pt": b"o"}, complete=True)
    assert one.take({"type": "checkpoint", "step": 5, "uri": str(local), "size_bytes": 2})
    (event,) = one.ready(wait=True)
    remote = f"{bucket}/step_00000005"
    assert event["uri"] == remote and event["type"] == "checkpoint"
    assert names(remote) == {"model.pt", "opt/state.pt", COMPLETE_MARKER}
    one.close()


@pytest.mark.parametrize("recording", [0, 1])
def test_rank_0s_node_records_a_checkpoint_once_every_other_nodes_part_of_the_attempt_is_in(
    tmp_path: Path, bucket: str, recording: int
) -> None:
    """`recording`: the gang's node whose ranks are torchrun's first (rank 0 writes the
    `checkpoint` event): c10d's rendezvous numbers nodes by arrival, so node 1 may be it."""
    other = 1 - recording
    recorder, sender = sync(tmp_path, bucket, recording, 2), sync(tmp_path, bucket, other, 2)
    part = stage(sender.staging, 5, {"__1_0.distcp": b"r1"}, complete=False)
    own = stage(recorder.staging, 5, {"__0_0.distcp": b"r0", ".metadata": b"m"}, complete=True)
    assert sender.take({"type": "checkpoint_part", "step": 5, "uri": str(part)})
    assert sender.ready(wait=True) == []  # a part is no checkpoint of its own
    assert not part.exists()  # the staged copy was in transit only
    recorder.take({"type": "checkpoint", "step": 5, "uri": str(own), "size_bytes": 3})
    (event,) = recorder.ready(wait=True)
    remote = f"{bucket}/step_00000005"
    assert event["type"] == "checkpoint" and event["uri"] == remote
    assert names(remote) == {
        "__0_0.distcp", "__1_0.distcp", ".metadata", part_marker(other, 2), COMPLETE_MARKER,
    }  # fmt: skip
    recorder.close()
    sender.close()


def test_without_another_nodes_part_the_checkpoint_stays_unrecorded_and_unmarked(
    tmp_path: Path, bucket: str
) -> None:
    """Node 1's host was lost before its part arrived; a marker of an earlier attempt of the
    same step (a retry that wrote it again) does not count."""
    node0 = sync(tmp_path, bucket, 0, 2, parts_timeout_s=0.6)
    remote = f"{bucket}/step_00000005"
    fs, root = fsspec.core.url_to_fs(remote)
    fs.pipe_file(f"{root}/{part_marker(1, 1)}", b"")
    own = stage(node0.staging, 5, {"__0_0.distcp": b"r0"}, complete=True)
    node0.take({"type": "checkpoint", "step": 5, "uri": str(own), "size_bytes": 2})
    (event,) = node0.ready(wait=True)
    assert event["type"] == "info" and "not recorded" in event["message"]
    assert "node(s) [1]" in event["message"]
    assert names(remote) == {part_marker(1, 1), "__0_0.distcp"}  # no completion marker
    node0.close()
