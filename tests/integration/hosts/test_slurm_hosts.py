"""A two-node Slurm cluster across two namespace hosts (issue 27): `slurmctld` and one `slurmd`
in host A, another `slurmd` in host B, each slurmd in a UTS namespace of its own so its host
name is its node's (`ty-a`, `ty-b`), addressed over the bridge (`NodeAddr`). The pool's
submitter runs in host A (the login node); `srun` starts a node agent on each node, and the
2-node job trains across the hosts (rendezvous and gloo over the veth network, checkpoints in
the bucket) to the losses of one Celery host with two processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.faults.test_gang import STEPS, gang_spec, nodes_of
from tests.integration.hosts.conftest import HostWorker
from tests.integration.hosts.netns import Host, Network
from tests.integration.s3server import S3
from tests.integration.workers.helpers import (
    TERMINAL,
    metric_series,
    run_to_success,
    start_worker,
    submit,
    unique_queue,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.hosts, pytest.mark.s3]

PARTITION = "hosts"
NODES = ("ty-a", "ty-b")


@dataclass
class Cluster:
    conf: Path
    ctld: subprocess.Popen[bytes]
    slurmds: list[subprocess.Popen[bytes]]
    logs: Path

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
            for p in sorted(self.logs.glob("*.log"))
        )


def _conf(root: Path, a: Host, b: Host) -> str:
    memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.4)
    cpus = os.cpu_count() or 2
    return "\n".join([
        "ClusterName=tyhosts",
        f"SlurmctldHost=ty-ctld({a.address})",
        "SlurmctldPort=7817", "SlurmdPort=7818",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        f"StateSaveLocation={root}/ctld", f"SlurmdSpoolDir={root}/%n",
        f"SlurmctldPidFile={root}/ctld.pid", f"SlurmdPidFile={root}/%n.pid",
        f"SlurmctldLogFile={root}/logs/ctld.log", f"SlurmdLogFile={root}/logs/%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory", "ReturnToService=2", "MinJobAge=600",
        "KillWait=10", "SlurmdTimeout=30", "InactiveLimit=0",
        "JobAcctGatherType=jobacct_gather/linux", "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        f"NodeName={NODES[0]} NodeAddr={a.address} CPUs={cpus} RealMemory={memory} State=UNKNOWN",
        f"NodeName={NODES[1]} NodeAddr={b.address} CPUs={cpus} RealMemory={memory} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])  # fmt: skip


def _in_uts(host: Host, name: str, command: list[str]) -> list[str]:
    """`command` in `host`'s network namespace and a UTS namespace whose host name is `name`
    (Slurm's daemons find their node, and slurmctld that it is the controller, by host name).
    `nsenter --net`, not `ip netns exec`: that one remounts /sys, hiding /sys/fs/cgroup, where
    slurmd's cgroup plugin and the jobs' own cgroups live."""
    script = f'hostname {name} && exec "$@"'
    return ["nsenter", f"--net=/run/netns/{host.ns}", "unshare", "--uts", "sh", "-c", script,
            "sh", *command]  # fmt: skip


def _idle(login: Host, env: dict[str, str]) -> bool | None:
    """Both nodes idle, as `sinfo` in `login` says (the root namespace has no route to the
    hosts' network)."""
    out = subprocess.run(login.argv(["sinfo", "-h", "-N", "-o", "%N %T"]), capture_output=True,
                         text=True, timeout=10, env={**os.environ, **env},
                         check=False).stdout  # fmt: skip
    states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    return all(states.get(n) == "idle" for n in NODES) or None


@pytest.fixture
def cluster(network: Network, tmp_path: Path) -> Iterator[Cluster]:
    if shutil.which("slurmctld") is None or shutil.which("nsenter") is None:
        pytest.skip("needs slurm-wlm (bash scripts/slurm.sh) and util-linux's unshare")
    subprocess.run(["bash", "scripts/slurm.sh"], check=True, timeout=600)  # munged, the tools
    a, b = network.add_host(), network.add_host()
    root = tmp_path / "slurm"
    for d in ("ctld", "logs", *NODES):
        (root / d).mkdir(parents=True)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, a, b))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    logs = root / "logs"
    started: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str], name: str) -> subprocess.Popen[bytes]:
        with (logs / f"{name}.out.log").open("wb") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        started.append(proc)
        return proc

    try:
        ctld = spawn(_in_uts(a, "ty-ctld", ["slurmctld", "-D", "-c", "-f", str(conf)]), "ctld")
        slurmds = [
            spawn(_in_uts(host, node, ["slurmd", "-D", "-f", str(conf)]), node)
            for host, node in zip((a, b), NODES, strict=True)
        ]
        made = Cluster(conf=conf, ctld=ctld, slurmds=slurmds, logs=logs)
        try:
            wait_for("both nodes idle", lambda: _idle(a, made.env), 60)
        except BaseException:
            print(made.tail())
            raise
        yield made
    finally:
        for proc in reversed(started):
            proc.terminate()
        deadline = time.monotonic() + 20
        for proc in started:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.long  # ~2 min
def test_a_two_node_job_on_a_slurm_pool_trains_across_two_hosts_to_the_losses_of_one_host(
    engine: Engine,
    s3_settings: Settings,
    s3: S3,
    services: dict[str, str],
    celery_client: Celery,
    network: Network,
    cluster: Cluster,
    host_worker: HostWorker,
    uploaded: tuple[ProjectKey, str],
    worker_logs: Path,
    tmp_path: Path,
) -> None:
    project, dataset_id = uploaded
    a, b = network.hosts[:2]
    pool = unique_queue("slurmhosts")
    login = s3_settings.model_copy(update={
        "home": tmp_path / "login", "database_url": services["database_url"],
        "broker_url": services["broker_url"],
    })  # fmt: skip
    submitter = start_worker(
        settings=login,
        client=celery_client,
        queue=pool,
        log_dir=worker_logs,
        extra_env={
            **s3.env, **cluster.env, "FSSPEC_S3_ENDPOINT_URL": services["s3_endpoint"],
            "GLOO_SOCKET_IFNAME": "eth0",
            "TORCHYARD_SLURM_POOLS": json.dumps({pool: {"partition": PARTITION, "poll_s": 0.5}}),
        },
        argv_prefix=a.argv([]),
    )  # fmt: skip
    try:
        job_id = submit(engine, celery_client, project, gang_spec(pool, dataset_id, nodes=2,
                                                                  procs=1))  # fmt: skip
        job = wait_state(engine, job_id, TERMINAL, 300, submitter)
        assert job.state == "succeeded", f"{job.error}\n{job.failure}\n{cluster.tail()}"
        assert (job.attempt, job.current_step) == (1, STEPS)
        # One agent per Slurm node, each in its host's namespace: node 0 on the batch host
        # (ty-a, host A) published its own address, node 1 joined from host B's.
        nodes = nodes_of(engine, job_id, 1)
        assert [(n.node_rank, n.host) for n in nodes] == [(0, a.address), (1, b.address)], nodes
        assert [n.worker.rsplit("@", 1)[1] for n in nodes if n.worker] == list(NODES)
    finally:
        submitter.stop()

    reference_pool = unique_queue("slurmref")
    worker = host_worker(a, reference_pool)
    reference = run_to_success(
        engine, celery_client, project, gang_spec(reference_pool, dataset_id, nodes=1, procs=2),
        worker, 300,
    )  # fmt: skip
    for name in ("loss", "eval_loss"):
        points = metric_series(engine, job_id, name)
        expected = metric_series(engine, reference.id, name)
        assert [p.step for p in points] == [p.step for p in expected]
        assert [p.value for p in points] == pytest.approx([p.value for p in expected], rel=1e-5)
