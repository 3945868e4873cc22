"""The CLI's units, as the dashboard's pages print them (api/static/js/util.js): durations
(``3m51s``), metric values (`fmtNumber`), throughputs (``20.6k``), seconds (``0.512 s``), bytes
(``1.3 GB``, `dataformat.units.format_bytes`, the one formatter the worker shares) and instants
(``2026-11-25 12:00:03 UTC``: one zone, named, as on every page). One module, so the terminal
and the pages cannot drift apart (tests/unit/torchyard/test_client_units.py)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from dataformat.units import format_bytes

__all__ = [
    "format_age",
    "format_bytes",
    "format_duration",
    "format_metric",
    "format_rate",
    "format_seconds",
    "format_value",
    "format_when",
]


def format_duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``1h02m``, ``2d03h``; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_value(value: float | None) -> str:
    """A metric value as the pages' `fmtNumber` (api/static/js/util.js) prints it: a whole
    number with thousands separators (``12,800``), 4 significant digits (``2.346``), ``3.00e-4``
    below 1e-3 or from 1e6; ``-`` when unknown. No trailing zeros (``2.5``), on the page too."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("-" if value < 0 else "") + "Infinity"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return _short_exponent(f"{value:.2e}")
    return _short_exponent(f"{value:.4g}")


def _short_exponent(text: str) -> str:
    """JavaScript's exponent: ``1.235e+4``, not Python's ``1.235e+04``."""
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", text)


_SI_PREFIXES = ("", "k", "M", "G", "T", "P")


def format_rate(value: float | None) -> str:
    """A throughput with 3 significant digits and an SI prefix, as the job page's tokens/s
    chart (d3's ``.3s``): ``950``, ``20.6k``, ``4.10M``; below 1 plain (``0.5``); ``-`` when
    unknown."""
    if value is None:
        return "-"
    if not math.isfinite(value) or value < 1:
        return f"{value:.3g}"
    mantissa, exponent = f"{value:.2e}".split("e")
    power = int(exponent)
    prefix = min(power // 3, len(_SI_PREFIXES) - 1)
    shift = power - 3 * prefix
    return f"{float(mantissa) * 10**shift:.{max(0, 2 - shift)}f}{_SI_PREFIXES[prefix]}"


def format_seconds(seconds: float | None) -> str:
    """A time such as a step's: ``0.512 s``, ``1.2 s`` (`format_value`, as the job page's step
    time chart: util.js `fmtSeconds`), from a minute on as a duration (``3m51s``); ``-`` when
    unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return format_duration(seconds) if seconds >= 60 else f"{format_value(seconds)} s"


def format_metric(name: str, value: float | None) -> str:
    """A metric's value in its unit, as the job page shows it: bytes (``rss_bytes``,
    ``sys/gpu_memory_bytes/0``) as ``1.3 GB``, ``tokens_per_second`` as ``20.6k``, a time in
    seconds (a name part ending ``_s``: ``step_time_s/max``) as ``0.512 s``, any other as
    `format_value`."""
    if value is None:
        return "-"
    parts = name.split("/")
    if any("_bytes" in part for part in parts):
        return format_bytes(round(value))
    if "tokens_per_second" in parts:
        return format_rate(value)
    if any(part.endswith("_s") for part in parts):
        return format_seconds(value)
    return format_value(value)


def format_when(when: datetime | None, now: datetime | None = None) -> str:
    """``2026-11-25 12:00:03 UTC (5m00s ago)``; ``-`` when unknown."""
    if when is None:
        return "-"
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    stamp = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({format_age(when, now)})"


def format_age(when: datetime | None, now: datetime | None = None) -> str:
    """``5m ago`` style; ``-`` when unknown."""
    if when is None:
        return "-"
    now = now or datetime.now(UTC)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return f"{format_duration((now - when).total_seconds())} ago"
