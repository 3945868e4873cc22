"""The fleet run over time, as a PNG (matplotlib, headless): jobs queued, slots held (jobs
starting, running or restarting), and each job's queue -> claim latency at its claim, by
priority; the faults marked where they struck. Its data is the run's JSON `timeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(path: Path, timeline: dict[str, Any], title: str) -> None:
    """Write `timeline` (seconds from the run's start: `samples` [t, queued, holding],
    `claims` [t, wait_s, priority], `faults` [t, what]) to `path` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (queue, held, claim) = plt.subplots(3, 1, sharex=True, figsize=(10, 8), dpi=110)
    samples = timeline["samples"]
    t = [s[0] for s in samples]
    queue.plot(t, [s[1] for s in samples], color="tab:orange")
    queue.set_ylabel("jobs queued")
    held.plot(t, [s[2] for s in samples], color="tab:blue")
    held.axhline(timeline["slots_total"], color="grey", linestyle=":", label="slots")
    held.set_ylabel("jobs holding a slot")
    held.legend(loc="upper right")
    for priority in sorted({c[2] for c in timeline["claims"]}):
        mine = [c for c in timeline["claims"] if c[2] == priority]
        claim.scatter([c[0] for c in mine], [c[1] for c in mine], s=6, label=f"priority {priority}")
    claim.set_yscale("symlog", linthresh=1.0)
    claim.set_ylabel("queue -> claim (s)")
    claim.set_xlabel("seconds from the first submission")
    if timeline["claims"]:
        claim.legend(loc="upper left", fontsize="small")
    for at, what in timeline["faults"]:
        for ax in (queue, held, claim):
            ax.axvline(at, color="tab:red", linewidth=0.8, alpha=0.7)
        queue.annotate(what, (at, 0), rotation=90, fontsize=7, color="tab:red", va="bottom")
    for ax in (queue, held, claim):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
