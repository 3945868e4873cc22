"""A curious tenant's program (issue 32): an entrypoint job that probes what a job can reach
(another process's environment, another project's files and row cache, the worker's home, the
storage root, Postgres, Redis, the metadata address, other processes) and tries to write outside
its own directories. `run_probe` runs it on any pool (a Celery worker's, a Slurm pool's) and
returns what got through; the tests say what must not (test_sandbox.py, test_slurm.py)."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from core.platform.storage import job_run_dir, row_cache_dir
from jobspec.job import ScriptJobSpec
from tests.conftest import ProjectKey
from tests.integration.workers.archives import store_archive
from tests.integration.workers.helpers import Worker, create_job, send, wait_state

PROBE_TIMEOUT_S = 120.0

WORKER_SECRET = f"postgresql://torchyard:{secrets.token_hex(8)}@db/torchyard"

# Prints what it could reach as JSON in its run dir: True where a probe got through.
PROBE_PY = r"""
import json, os, socket, sys

facts = json.loads(sys.argv[1])
reached = {}

def environ_of_others():
    mine = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            text = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if facts["secret"].encode() in text:
            return True
    return False

def readable(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False

def listable(path):
    try:
        return bool(set(os.listdir(path)) - set(facts["own"].get(path, [])))
    except OSError:
        return False

def connects(host, port):
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False

def other_processes():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"celery" in cmd:
            return True
    return False

def writes(path):
    try:
        with open(path, "w") as f:
            f.write("escaped")
        return True
    except OSError:
        return False

reached["ancestor_environ"] = environ_of_others()
reached["other_projects_file"] = readable(facts["other_file"])
reached["worker_home_file"] = readable(facts["home_file"])
reached["storage_root_listing"] = listable(facts["storage_root"])
reached["postgres"] = connects("127.0.0.1", 5432)
reached["redis"] = connects("127.0.0.1", 6379)
if facts.get("metadata", True):  # never tried where nothing fences it: it is not ours to reach
    reached["metadata"] = connects("169.254.169.254", 80)
reached["other_processes"] = other_processes()
if facts.get("listener"):  # a job that keeps the network: it does reach what is not fenced
    network = connects(*facts["listener"])
declared = os.environ.get("TORCHYARD_INPUT_MINE", "")
if facts.get("declared"):  # its own input: readable where the platform says, never writable
    reached["declared_input"] = listable(declared)
for name, path in facts["writes"].items():
    writes(path.replace("{declared}", declared))
with open(os.path.join(os.environ["TORCHYARD_RUN_DIR"], "probe.json"), "w") as f:
    json.dump({**reached, **({"own_listener": network} if facts.get("listener") else {})}, f)
"""


def run_probe(
    engine: Engine,
    settings: Settings,
    client: Celery,
    worker: Worker,
    project: ProjectKey,
    tmp_path: Path,
    nodes: int = 1,
    listener: tuple[str, int] | None = None,
    metadata: bool = True,
    declared: tuple[str, Path] | None = None,
) -> tuple[dict[str, bool], dict[str, Path]]:
    """Run the probe as project `project`'s job of `nodes` nodes (a gang keeps the network);
    (what it reached, on any node, the files it tried to write outside its directories).
    `listener`: an address the job should reach (`own_listener`). `declared`: a dataset of the
    project (id, its directory on the host) the job declares as input `mine`: it reads it
    (`declared_input`) and tries to write into it."""
    storage = settings.storage_path
    other = storage / "datasets" / f"prj_other_{secrets.token_hex(4)}" / "train.jsonl"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text('{"text": "project A\'s data"}\n')
    home_file = settings.home / f"secret-{secrets.token_hex(4)}.txt"
    home_file.write_text("the worker's own")
    tag = secrets.token_hex(4)
    other_cache = row_cache_dir(settings, f"prj_other_{tag}")  # another project's tokenized rows
    other_cache.mkdir(parents=True, exist_ok=True)
    escapes = {
        "other_projects_row_cache": other_cache / f"escape-{tag}",
        "storage_root": storage / f"escape-{tag}",
        "worker_home": settings.home / f"escape-{tag}",
        "source_tree": Path(sys.prefix) / f"escape-{tag}",
        "elsewhere": tmp_path / f"escape-{tag}",
    }
    facts = {
        "secret": WORKER_SECRET,
        "other_file": str(other),
        "home_file": str(home_file),
        "storage_root": str(storage),
        "own": {str(storage): ["jobs"]},
        "writes": {k: str(v) for k, v in escapes.items()},
        "listener": listener,
        "metadata": metadata,
        "declared": declared is not None,
    }
    inputs = {}
    if declared is not None:
        inputs = {"mine": {"dataset": declared[0]}}
        escapes["declared_input"] = declared[1] / f"escape-{tag}"
        facts["writes"]["declared_input"] = "{declared}/" + f"escape-{tag}"
    code = store_archive(engine, settings, project, {"probe.py": PROBE_PY})
    spec = ScriptJobSpec.model_validate(
        {
            "name": "curious",
            "resources": {"procs_per_node": 1, "pool": worker.queue, "nodes": nodes},
            "entrypoint": {
                "code": code,
                "command": ["python", "probe.py", json.dumps(facts)],
                "inputs": inputs,
            },
        }
    )
    job_id = create_job(engine, project, spec)
    send(client, job_id, worker.queue)
    job = wait_state(engine, job_id, ("succeeded", "failed"), PROBE_TIMEOUT_S, worker)
    # The whole failure as text (pytest cuts a dict's repr): its log tail says what happened.
    assert job.state == "succeeded", json.dumps(job.failure, indent=1, default=str)
    runs = [job_run_dir(settings, job_id, 1, None if nodes == 1 else n) for n in range(nodes)]
    found = [json.loads((run / "probe.json").read_text()) for run in runs]
    reached = {key: any(f[key] for f in found) for key in found[0]}
    return reached, escapes
