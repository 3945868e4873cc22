"""Declared inputs on object storage: the worker's fetch into its host cache vs a plain s3fs
download of the same objects, and what a cache hit costs (issue 43).

    python -m bench.inputs [--size-mb 1024 --files 8] [--smoke]

A moto S3 server on loopback holds a dataset of `--files` objects of random bytes,
`--size-mb` in all. Measured, each `--repeats` times (median):

- `fetch`: `workers.inputs.InputCache.get` of the dataset, cold: list, download (s3fs's
  concurrent `get`), the sha256 of every byte checked against the pinned one, renamed into place;
- `s3fs_get`: `fs.get(prefix, dir, recursive=True)` of the same prefix, what `aws s3 cp
  --recursive` does (no checksum);
- `hit`: `InputCache.get` of the cached dataset (its key is its sha256: no request to S3) and of
  a path input (its key needs a listing: one LIST), in ms.

Prints one JSON document. The fetch reads the data twice (download, then the checksum) where
the plain copy reads it once: on a host whose disk is faster than its network the ratio nears 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._common import emit, note
from bench.smoke import parse

MB = 1024**2


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on a free loopback port (its endpoint URL); stopped at the end."""
    from workers.launcher import free_port  # outside the ephemeral range (bench.data's note)

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="the dataset's size (MiB)")
    parser.add_argument("--files", type=int, default=8, help="objects it is made of")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hits", type=int, default=50, help="cache hits timed")
    args = parse(parser, size_mb=8, files=4, repeats=1, hits=5)
    with moto_server() as endpoint:
        os.environ.update(
            {
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench-secret",
                "AWS_DEFAULT_REGION": "us-east-1",
                "FSSPEC_S3_ENDPOINT_URL": endpoint,
            }
        )
        emit(run(args))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import fsspec

    from core.datasets.service import digest_path
    from core.jobs.inputs import Located
    from workers.inputs import InputCache, PlacedInputs

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    bucket = f"bench-inputs-{secrets.token_hex(4)}"
    fs.mkdir(bucket)
    prefix = f"s3://{bucket}/datasets/corpus"
    with tempfile.TemporaryDirectory(prefix="bench-inputs-") as tmp:
        work = Path(tmp)
        local = work / "source"
        local.mkdir()
        per_file = args.size_mb * MB // args.files
        for i in range(args.files):
            (local / f"part-{i:04d}.bin").write_bytes(os.urandom(per_file))
        size, sha256, _ = digest_path(local)
        note(f"uploading {size / MB:.0f} MiB in {args.files} objects")
        fs.put(f"{local}/", f"{prefix}/", recursive=True)
        dataset = Located("corpus", "dataset", prefix, sha256, sha256, "dataset corpus")
        path = Located("raw", "path", prefix, "path", None, prefix)

        def quiet(message: str, data: dict[str, Any]) -> None:
            pass

        fetch_s, plain_s = [], []
        for repeat in range(args.repeats):
            cache_dir = work / f"cache-{repeat}"
            started = time.perf_counter()
            InputCache(cache_dir, 10 * size).get(dataset, PlacedInputs(), report=quiet)
            fetch_s.append(time.perf_counter() - started)
            target = work / f"plain-{repeat}"
            started = time.perf_counter()
            fs.invalidate_cache()
            fs.get(f"{prefix}/", f"{target}/", recursive=True)
            plain_s.append(time.perf_counter() - started)
            note(f"repeat {repeat}: fetch {fetch_s[-1]:.2f} s, s3fs get {plain_s[-1]:.2f} s")
            shutil.rmtree(target)
            if repeat < args.repeats - 1:
                shutil.rmtree(cache_dir)
        cache = InputCache(work / f"cache-{args.repeats - 1}", 10 * size)
        cache.get(path, PlacedInputs(), report=quiet)  # the path input's entry, cold
        hits = {"dataset": _hits(cache, dataset, args.hits), "path": _hits(cache, path, args.hits)}
    fetch, plain = statistics.median(fetch_s), statistics.median(plain_s)
    return {
        "bench": "inputs",
        "size_bytes": size,
        "files": args.files,
        "fetch": {"seconds": round(fetch, 3), "mb_per_s": round(size / MB / fetch, 1)},
        "s3fs_get": {"seconds": round(plain, 3), "mb_per_s": round(size / MB / plain, 1)},
        "fetch_vs_s3fs_get": round(plain / fetch, 3),
        "hit_ms": hits,
    }


def _hits(cache: Any, item: Any, n: int) -> dict[str, float]:
    from workers.inputs import PlacedInputs

    times = []
    for _ in range(n):
        placed = PlacedInputs()
        started = time.perf_counter()
        cache.get(item, placed, report=lambda message, data: None)
        times.append((time.perf_counter() - started) * 1000)
        placed.release()
    times.sort()
    return {
        "p50": round(statistics.median(times), 3),
        "p99": round(times[min(len(times) - 1, int(len(times) * 0.99))], 3),
    }


if __name__ == "__main__":
    main()
