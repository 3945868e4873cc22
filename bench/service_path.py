"""The service path against the bench path: one spec trained both ways, tokens/s compared.

    python bench/service_path.py [--device cuda] [--method single] [--steps 300] ...

Run 1 (bench): `bench/trainer_methods.py`'s `run_method` trains the spec directly (the
trainer process, or torchrun). Run 2 (service): the embedded default as `torchyard
quickstart` starts it (SQLite, Celery over kombu's filesystem transport, local storage; no
servers to install): the API and one worker as child processes, the same corpus registered
as a dataset, the same spec submitted through the SDK's `Client`, waited for, and its metrics
read back through the API. Both take the median `step_time_s` of the steps after `--warmup`
up to `--steps`; `service_vs_bench` is the service's tokens/s over the bench's (the goal on a
GPU: within 2%). The worker samples its host every second here
(`TORCHYARD_SYS_METRICS_INTERVAL_S`), and the JSON lists every `sys/*` series it stored (on
CUDA `sys/gpu_util_percent/gpu0`, `sys/gpu_memory_bytes/gpu0`, `sys/gpu_power_watts/gpu0`)
with its point count and range. Exits 1 when the job did not complete. Not a test: the
figures vary run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import smoke, trainer_methods  # noqa: E402
from torchyard.client import Client  # noqa: E402
from torchyard.quickstart import (  # noqa: E402
    Servers,
    bootstrap,
    embedded_env,
    free_port,
    register_corpus,
    with_data_root,
)

JOB_TIMEOUT_S = 1800.0


def run_service(args: argparse.Namespace, corpus: Path, home: Path) -> dict[str, Any]:
    """Train `args.method`'s spec through the API and a worker on the embedded default."""
    nproc, spec = trainer_methods.method_spec(args, corpus, args.method)
    env = with_data_root(embedded_env(home, os.environ), corpus)
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env |= {"TORCHYARD_SYS_METRICS_INTERVAL_S": "1", "PYTHONPATH": path,
            "OMP_NUM_THREADS": str(args.threads)}  # fmt: skip
    logs = home / "logs"
    logs.mkdir(parents=True)
    api_key = bootstrap(env, logs / "admin.log", "bench")
    body = spec.model_dump(mode="json")
    body["data"] = {"dataset": None}
    servers = Servers(env, logs, free_port())
    try:
        servers.start(body["resources"]["pool"])
        servers.wait_ready(120.0)
        with Client(servers.url, api_key, timeout=60.0) as client:
            body["data"]["dataset"] = register_corpus(client, corpus).id
            job = client.jobs.create(body)
            job = client.jobs.wait(job.id, poll_s=1.0, timeout_s=JOB_TIMEOUT_S)
            series = {
                s.name: dict(zip(s.steps, s.values, strict=True))
                for s in client.jobs.metrics(job.id)
            }
    finally:
        servers.stop()
    step_s = trainer_methods.median_timed(series.get("step_time_s", {}), args)
    mfu = trainer_methods.median_timed(series.get("mfu", {}), args)
    tokens_per_step = args.batch * args.seq_len
    return {
        "job_id": job.id,
        "state": job.state,
        "processes": nproc,
        "seconds_per_step": round(step_s, 5) if step_s else None,
        "tokens_per_second": round(tokens_per_step / step_s, 1) if step_s else None,
        "mfu": round(mfu, 4) if mfu is not None else None,
        "sys_series": {
            name: {
                "points": len(by_step),
                "min": min(by_step.values()),
                "max": max(by_step.values()),
            }
            for name, by_step in sorted(series.items())
            if name.startswith("sys/") and by_step
        },
        "worker_log_tail": None if job.state == "succeeded" else servers.children[1].log_tail(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    trainer_methods.add_model_arguments(p)
    p.add_argument("--method", default="single", choices=sorted(trainer_methods.METHODS))
    p.set_defaults(steps=300, warmup=20)
    args = smoke.parse(
        p, steps=3, warmup=1, batch=4, n_layers=1, d_model=32, seq_len=32, device="cpu"
    )
    args.profile_steps = 0
    with tempfile.TemporaryDirectory() as tmp:
        corpus = trainer_methods.build_corpus(Path(tmp), 2_000_000)
        bench = trainer_methods.run_method(args, corpus, args.method, Path(tmp) / "bench")
        service = run_service(args, corpus, Path(tmp) / "home")
    ratio = None
    if service["tokens_per_second"] and bench.get("tokens_per_second"):
        ratio = round(service["tokens_per_second"] / bench["tokens_per_second"], 4)
    config = {k: v for k, v in vars(args).items() if k != "smoke"}
    doc = {"config": config, "bench": bench, "service": service, "service_vs_bench": ratio}
    print(json.dumps(doc, indent=2))
    sys.exit(0 if service["state"] == "succeeded" and "error" not in bench else 1)


if __name__ == "__main__":
    main()
