"""The fleet's object store: an S3 server (`moto` in server mode, as the storage suite runs it)
on a loopback port, with one bucket, reached by every process through the settings production
uses (`TORCHYARD_STORAGE_URL=s3://...`, the AWS variables and `FSSPEC_S3_ENDPOINT_URL`, as in
docker-compose.yml). Its requests are counted from its own log: the server writes one line per
request it answered (`"PUT /bucket/key HTTP/1.1" 200`).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench._common import free_port, wait_for

REQUEST = re.compile(rb'"(GET|PUT|POST|HEAD|DELETE) (/\S*) HTTP/[\d.]+" (\d+)')


@dataclass(frozen=True)
class Store:
    """The S3 server: the storage URL and the environment every process gets for it."""

    url: str
    env: dict[str, str]
    log: Path

    def requests(self) -> Counter[str]:
        """Requests answered so far, by method (and `status_ge_400`: answers 4xx/5xx, most of
        them 404s to existence checks); moto's own
        `/moto-api` calls (the bench's readiness check) left out."""
        found: Counter[str] = Counter()
        for method, path, status in REQUEST.findall(self.log.read_bytes()):
            if not path.startswith(b"/moto-api"):
                found[method.decode()] += 1
                found["status_ge_400"] += int(status) >= 400
        return found


@contextlib.contextmanager
def s3_store(root: Path) -> Iterator[Store]:
    """A moto S3 server with a new bucket, its log under `root`; stopped at the end."""
    port = free_port()
    log = root / "moto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"moto exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            return httpx.get(f"{endpoint}/moto-api/", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, 60, "the S3 server to answer", poll_s=0.2)
        bucket = f"fleet-{secrets.token_hex(4)}"
        httpx.put(f"{endpoint}/{bucket}", timeout=10).raise_for_status()
        env = {
            "AWS_ACCESS_KEY_ID": "fleet",
            "AWS_SECRET_ACCESS_KEY": f"fleet-{secrets.token_hex(8)}",
            "AWS_DEFAULT_REGION": "us-east-1",
            "FSSPEC_S3_ENDPOINT_URL": endpoint,
        }
        yield Store(url=f"s3://{bucket}/torchyard", env=env, log=log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
