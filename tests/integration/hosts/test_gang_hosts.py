"""A two-node gang across two hosts that share only the network, Postgres, Redis and S3:
rendezvous and gloo over the veth network (not loopback), checkpoints in the bucket, each
host's scratch its own."""

from __future__ import annotations

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from core.platform.storage import checkpoint_complete, job_checkpoint_uri
from tests.conftest import ProjectKey
from tests.integration.faults.test_gang import STEPS, gang_spec, nodes_of
from tests.integration.hosts.conftest import HostWorker
from tests.integration.hosts.netns import Network
from tests.integration.s3server import s3_fs, under
from tests.integration.workers.helpers import (
    TERMINAL,
    job_events,
    launches,
    metric_series,
    run_to_success,
    submit,
    unique_queue,
    wait_state,
)

pytestmark = [pytest.mark.hosts, pytest.mark.s3]


@pytest.mark.long  # ~2 min
def test_a_two_node_gang_across_two_hosts_trains_to_the_losses_of_one_node_with_two_procs(
    engine: Engine,
    s3_settings: Settings,
    celery_client: Celery,
    network: Network,
    host_worker: HostWorker,
    uploaded: tuple[ProjectKey, str],
) -> None:
    project, dataset_id = uploaded
    a, b = network.add_host(), network.add_host()
    queue = unique_queue("hosts")
    workers = [host_worker(a, queue), host_worker(b, queue)]
    job_id = submit(engine, celery_client, project, gang_spec(queue, dataset_id, nodes=2, procs=1))
    job = wait_state(engine, job_id, TERMINAL, 300, workers[0])
    assert job.state == "succeeded", f"{job.error}\n{workers[1].log[-4000:]}"
    assert (job.attempt, job.current_step) == (1, STEPS)

    # One node per host; node 0 published its own address, and both torchruns met there.
    nodes = nodes_of(engine, job_id, 1)
    assert {(n.worker, n.host) for n in nodes} == {
        (w.name, h.address) for w, h in zip(workers, (a, b), strict=True)
    }
    endpoint = f"{nodes[0].host}:{nodes[0].port}"
    assert nodes[0].host in (a.address, b.address)
    by_rank = {n.node_rank: n.host for n in nodes}
    for launch in launches(job_events(engine, job_id)):
        argv = launch.data["argv"]
        assert argv[argv.index("--rdzv-endpoint") + 1] == endpoint
        assert argv[argv.index("--local-addr") + 1] == by_rank[launch.data["node_rank"]]

    # The checkpoints are whole in the bucket, written by both hosts' ranks.
    root = job_checkpoint_uri(s3_settings, job_id)
    s3_fs().invalidate_cache()
    saved = sorted(p.rsplit("/", 1)[1] for p in s3_fs().ls(under(root)))
    assert saved and all(checkpoint_complete(f"{root}/{name}") for name in saved)

    reference = run_to_success(
        engine,
        celery_client,
        project,
        gang_spec(queue, dataset_id, nodes=1, procs=2),
        workers[0],
        300,
    )
    for name in ("loss", "eval_loss"):
        points = metric_series(engine, job_id, name)
        expected = metric_series(engine, reference.id, name)
        assert [p.step for p in points] == [p.step for p in expected]
        assert [p.value for p in points] == pytest.approx([p.value for p in expected], rel=1e-5)
    print(f"final loss: 2 hosts x 1 {job.latest_metrics['loss']:.6f}, "
          f"1 host x 2 {reference.latest_metrics['loss']:.6f}")  # fmt: skip
