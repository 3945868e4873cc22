"""The worker's NVML paths on a real GPU (never in tests or CI, which have no GPU).

    python bench/cuda_workers_check.py

Starts a CUDA process that holds ~2 GiB and multiplies matrices, then asks the worker's own
code what a worker on this host would see: `workers.devices.gpu_indices`, `inventory`,
`busy_gpus` (the GPU must be busy while the process runs and free after it), and
`workers.watchers.sysmetrics.GpuSampler` + `readings` for the process's pid (utilisation, memory and
power of its GPU, as `sys/gpu_*` series). Prints one JSON document with each figure and a
`checks` map of name -> bool; exits 1 if any check is false.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.platform.settings import Settings
from workers import devices
from workers.watchers import sysmetrics

BUSY = """
import sys, time, torch
x = torch.randn(16384, 16384, device="cuda")  # 1 GiB; the product another 1 GiB
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    y = x @ x
torch.cuda.synchronize()
"""


def main() -> None:
    out: dict[str, object] = {"gpu_indices": list(devices.gpu_indices())}
    found = devices.inventory(Settings())
    out["inventory"] = {"kind": found.kind, "devices": list(found.indices)}
    out["busy_before"] = sorted(devices.busy_gpus())
    proc = subprocess.Popen([sys.executable, "-c", BUSY, "20"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip() == "ready"
    time.sleep(3)  # a bench, not a test: let the utilisation counter see the products
    out["busy_during"] = sorted(devices.busy_gpus())
    sampler = sysmetrics.GpuSampler()
    by_pid = sampler.sample([proc.pid])
    by_visible = sampler.sample([], visible=["0"])
    usage = by_pid or by_visible
    procs = sysmetrics.ProcessSampler(proc.pid).sample()
    series = {r.series: r.value for r in sysmetrics.readings(procs, usage, node_rank=0)}
    proc.wait()
    out["busy_after"] = sorted(devices.busy_gpus())
    sampler.close()
    out["sample_by_pid"] = {i: vars(u) for i, u in by_pid.items()}
    out["sample_by_visible"] = {i: vars(u) for i, u in by_visible.items()}
    out["series"] = series
    gpu0 = usage.get(0)
    out["checks"] = {
        "child_ready": ready and proc.returncode == 0,
        "one_gpu_seen": out["gpu_indices"] == [0],
        "inventory_is_cuda": found.kind == "cuda" and list(found.indices) == [0],
        "busy_while_running": 0 in out["busy_during"],  # type: ignore[operator]
        "free_after": 0 not in out["busy_after"],  # type: ignore[operator]
        "sampled": gpu0 is not None,
        "util_over_50": gpu0 is not None and (gpu0.util_percent or 0) > 50,
        "memory_over_2gib": gpu0 is not None and (gpu0.memory_bytes or 0) > 2 * 2**30,
        "power_reported": gpu0 is not None and (gpu0.power_watts or 0) > 0,
        "gpu_series": {"sys/gpu_util_percent/gpu0", "sys/gpu_memory_bytes/gpu0"} <= set(series),
    }
    print(json.dumps(out, indent=2, default=str))
    sys.exit(0 if all(out["checks"].values()) else 1)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
