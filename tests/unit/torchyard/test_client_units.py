"""Issue 46: the CLI prints a job's figures as its page does. The expected strings are what
api/static/js/util.js (`fmtNumber`, `fmtBytes`, `fmtDuration`) and the job page's charts
(d3 ``.3s`` for tokens/s) print for the same inputs, no trailing zeros in either (``2.5``; the
page's `toPrecision` said ``2.500``); and util.js itself is asked (Node)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from torchyard.units import (
    format_bytes,
    format_duration,
    format_metric,
    format_rate,
    format_seconds,
    format_value,
)

UTIL_JS = Path(__file__).parents[3] / "api" / "static" / "js" / "util.js"

NUMBERS = {  # fmtNumber
    2.34567: "2.346",
    2.5: "2.5",
    3.0: "3",
    0.0: "0",
    0.002: "0.002",
    -1.25: "-1.25",
    1234.56: "1235",
    12_000.5: "1.2e+4",  # toPrecision: 1.200e+4
    12_345.6: "1.235e+4",
    12_800.0: "12,800",
    3e-4: "3.00e-4",
    1e-7: "1.00e-7",
    4.2e36: "4.20e+36",
    1.3e9: "1,300,000,000",
}
BYTES = {0: "0 B", 812: "812 B", 13_100: "13.1 kB", 8_000_000: "8.0 MB", 1_234_567_890: "1.2 GB"}
DURATIONS = {0.4: "0s", 42: "42s", 59.6: "1m00s", 185: "3m05s", 3720: "1h02m", 183_600: "2d03h"}
RATES = {950: "950", 12_345: "12.3k", 20_600: "20.6k", 123_456: "123k", 4_100_000: "4.10M",
         0.5: "0.5"}  # fmt: skip
SECONDS = {0.512: "0.512 s", 1.2: "1.2 s", 231.0: "3m51s"}


def test_values_sizes_and_durations_read_as_util_js_prints_them() -> None:
    assert {v: format_value(v) for v in NUMBERS} == NUMBERS
    assert {n: format_bytes(n) for n in BYTES} == BYTES
    assert {s: format_duration(s) for s in DURATIONS} == DURATIONS
    assert [format_value(None), format_bytes(None), format_duration(None)] == ["-"] * 3


def test_a_rate_reads_as_the_tokens_per_second_chart_prints_it() -> None:
    assert {r: format_rate(r) for r in RATES} == RATES
    assert {s: format_seconds(s) for s in SECONDS} == SECONDS


def test_a_metric_prints_in_its_unit_never_in_scientific_notation() -> None:
    """`metrics` printed `1.3e+09` bytes and `2.06e+04` tokens/s, `show` `1.3e+07` for RSS."""
    assert format_metric("sys/rss_bytes/0", 1.3e7) == "13.0 MB"
    assert format_metric("sys/gpu_memory_bytes/gpu0", 1.3e9) == "1.3 GB"
    assert format_metric("tokens_per_second", 20_600.0) == "20.6k"
    assert format_metric("step_time_s", 1.2) == "1.2 s"
    assert format_metric("step_time_s/max", 231.0) == "3m51s"
    assert format_metric("loss", 2.5) == "2.5"
    assert format_metric("loss", None) == "-"


def test_the_expected_strings_are_what_util_js_prints() -> None:
    # not a skip: scripts/browser.sh (run by scripts/test.sh) installs Node
    assert shutil.which("node"), "needs Node to run util.js: apt-get install nodejs"
    script = f"""
        const u = await import({json.dumps(UTIL_JS.as_uri())});
        const [numbers, bytes, durations, rates, seconds] = JSON.parse(process.argv[1]);
        console.log(JSON.stringify([
          numbers.map((v) => u.fmtNumber(v)), bytes.map(u.fmtBytes), durations.map(u.fmtDuration),
          rates.map(u.fmtRate), seconds.map(u.fmtSeconds),
        ]));
    """
    inputs = [list(NUMBERS), list(BYTES), list(DURATIONS), list(RATES), list(SECONDS)]
    done = subprocess.run(
        ["node", "--input-type=module", "-e", script, json.dumps(inputs)],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    numbers, sizes, durations, rates, seconds = json.loads(done.stdout)
    assert numbers == list(NUMBERS.values())
    assert rates == list(RATES.values())
    assert seconds == list(SECONDS.values())
    assert sizes == list(BYTES.values())
    assert durations == list(DURATIONS.values())
