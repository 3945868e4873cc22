"""`train.profile`: a `torch.profiler` window over optimizer steps, and what it says.

`StepProfiler` records CPU and (on CUDA) device activity for `num_steps` steps from the
attempt's `start_step`-th (`torch.profiler.schedule`: one warm-up step before the window),
then writes, for each rank, a Chrome trace (`rank<r>.json.gz`, Perfetto or chrome://tracing)
and `rank<r>.summary.json` (`summarize`) under `<checkpoint root>/profile/` through fsspec,
so they sit in the run's storage like its checkpoints, and logs the summary's headline.

Summary (all times in milliseconds per profiled step):
- `step_ms`: wall time between the window's first `ProfilerStep#` start and last end;
- `device_busy_ms`: union of the device's kernel and memcpy/memset intervals (overlapping
  streams count once); `device_idle_ms` = `step_ms` - busy: launch gaps and host syncs;
- `communication_ms`: kernels whose name says NCCL (or gloo on CPU: none are timed there);
  `compute_ms` = busy - communication, an upper bound when the two overlap;
- `top_kernels`: the device's (or, on CPU, the operators') largest self times.
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import fsspec
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from jobspec.job import ProfileSpec

log = logging.getLogger(__name__)
TOP_KERNELS = 15


class StepProfiler:
    """Call `step()` after every optimizer step of the attempt and `close()` at the end.

    `out_uri`: the directory (local path or fsspec URI) the trace and summary go to. Writing
    them never fails the run: an error is logged and the run goes on."""

    def __init__(self, spec: ProfileSpec, *, device: torch.device, out_uri: str, rank: int):
        self.spec, self.out_uri, self.rank = spec, out_uri.rstrip("/"), rank
        self.summary: dict[str, Any] | None = None
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._cuda = device.type == "cuda"
        warmup = 1 if spec.start_step > 1 else 0
        self._prof = profile(
            activities=activities,
            schedule=schedule(
                skip_first=spec.start_step - 1 - warmup,
                wait=0,
                warmup=warmup,
                active=spec.num_steps,
                repeat=1,
            ),
            on_trace_ready=self._ready,
        )
        self._prof.start()
        self._open = True

    def step(self) -> None:
        if self._open:
            self._prof.step()

    def close(self) -> None:
        """Stop profiling (a window cut short by the run's end is still written)."""
        if self._open:
            self._open = False
            self._prof.stop()

    def _ready(self, prof: profile) -> None:
        try:
            self.summary = summarize(prof, cuda=self._cuda, steps=self.spec.num_steps)
            self._write(prof, self.summary)
        except Exception:  # a profile is diagnostics: the run must not fail for it
            log.exception("profile: could not summarize or write the trace")
            return
        s = self.summary
        top = ", ".join(f"{k['name'][:48]} {k['ms_per_step']:.2f} ms" for k in s["top_kernels"][:3])
        device = (
            f", device busy {s['device_busy_ms']:.1f} ms (idle {s['device_idle_ms']:.1f}), "
            f"communication {s['communication_ms']:.1f} ms"
            if self._cuda
            else ""
        )
        log.info(
            "profile rank %d: %.1f ms/step%s; top: %s; trace %s/rank%d.json.gz",
            self.rank, s["step_ms"], device, top, self.out_uri, self.rank,
        )  # fmt: skip

    def _write(self, prof: profile, summary: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            fs, root = fsspec.core.url_to_fs(self.out_uri)
            fs.makedirs(root, exist_ok=True)
            with (
                trace.open("rb") as src,
                fs.open(f"{root}/rank{self.rank}.json.gz", "wb") as f,
                gzip.GzipFile(fileobj=f, mode="wb", compresslevel=3) as gz,
            ):
                shutil.copyfileobj(src, gz, 1 << 20)
            with fs.open(f"{root}/rank{self.rank}.summary.json", "w") as f:
                json.dump(summary, f, indent=2)


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (microseconds in, ms out)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1000.0


def summarize(prof: profile, *, cuda: bool, steps: int) -> dict[str, Any]:
    """The window's figures (module docstring), per step, from `prof.events()`."""
    events = prof.events()
    cpu = torch.autograd.DeviceType.CPU
    # `ProfilerStep*` is recorded twice on CUDA: the host's range, and its annotation on the
    # device's timeline (a span as long as the step, not work): steps from the host's only.
    step_spans = [
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.name.startswith("ProfilerStep") and e.device_type == cpu
    ]
    wall_us = (max(e for _, e in step_spans) - min(s for s, _ in step_spans)) if step_spans else 0
    n = max(1, len(step_spans) or steps)
    device_events = [
        e
        for e in events
        if cuda
        and e.device_type == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith("ProfilerStep")
    ]
    busy = _union_ms([(e.time_range.start, e.time_range.end) for e in device_events])
    comm = _union_ms(
        [(e.time_range.start, e.time_range.end) for e in device_events if "nccl" in e.name.lower()]
    )
    totals: dict[str, float] = {}
    calls: dict[str, int] = {}
    if cuda:
        for e in device_events:
            totals[e.name] = totals.get(e.name, 0.0) + (e.time_range.end - e.time_range.start)
            calls[e.name] = calls.get(e.name, 0) + 1
    else:
        for avg in prof.key_averages():
            totals[avg.key] = float(avg.self_cpu_time_total)
            calls[avg.key] = int(avg.count)
    top = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:TOP_KERNELS]
    step_ms = wall_us / 1000.0 / n
    busy_ms = busy / n
    return {
        "steps": n,
        "device": "cuda" if cuda else "cpu",
        "step_ms": round(step_ms, 3),
        "device_busy_ms": round(busy_ms, 3),
        "device_idle_ms": round(max(0.0, step_ms - busy_ms), 3) if cuda else None,
        "communication_ms": round(comm / n, 3),
        "compute_ms": round(max(0.0, busy_ms - comm / n), 3),
        "top_kernels": [
            {
                "name": name,
                "ms_per_step": round(us / 1000.0 / n, 3),
                "share": round(us / sum(totals.values()), 4) if totals else 0.0,
                "calls_per_step": round(calls[name] / n, 1),
            }
            for name, us in top
        ],
    }
