"""One delivery of `workers.export_checkpoint`: claim the export, run the exporter, record it.

The exporter is the trainer's own program, run as a subprocess (the worker never imports
trainer code: docs/ARCHITECTURE.md, 'Import rules'):

    python -m trainer.exports.safetensors --checkpoint STEP_URI --out EXPORT_URI

It reads only the model weights of the DCP checkpoint, whatever parallelism saved them, and
writes `EXPORT_URI/model.safetensors` + `config.json` through fsspec (CONTRACTS.md, section 1).
The worker then hashes `model.safetensors` (sha256, read in chunks) and marks the export ready;
a non-zero exit or a timeout marks it failed with the end of the exporter's stderr. A delivery
that loses the claim (a duplicate message, an export already done) returns at once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping

from sqlalchemy.orm import Session, sessionmaker

from core.jobs import exports
from core.platform import storage

log = logging.getLogger(__name__)

EXPORT_MODULE = "trainer.exports.safetensors"
EXPORT_TIMEOUT_S = 3600.0


def export_argv(source_uri: str, out_uri: str, python: str = sys.executable) -> list[str]:
    """The exporter's command line (CONTRACTS.md, section 1)."""
    return [python, "-m", EXPORT_MODULE, "--checkpoint", source_uri, "--out", out_uri]


def export_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` without the worker's `TORCHYARD_*` settings (its database URL among them)."""
    return {k: v for k, v in base.items() if not k.startswith("TORCHYARD_")}


def run_export(
    export_id: int,
    *,
    factory: sessionmaker[Session],
    worker: str,
    timeout_s: float = EXPORT_TIMEOUT_S,
) -> str:
    """Export `export_id` if it is still pending; returns what happened, in a word."""
    with factory() as session:
        claimed = exports.claim(session=session, export_id=export_id, worker=worker)
        session.commit()
    if claimed is None:
        log.info("export %s is not pending: nothing to do", export_id)
        return "not-claimed"
    argv = export_argv(claimed.source_uri, claimed.uri)
    log.info("export %s: %s", export_id, " ".join(argv))
    error = None
    try:
        done = subprocess.run(
            argv, env=export_env(os.environ), capture_output=True, timeout=timeout_s, check=False
        )
        if done.returncode != 0:
            stderr = done.stderr.decode(errors="replace").strip()
            error = f"exporter exited with {done.returncode}: {stderr}"
    except subprocess.TimeoutExpired:
        error = f"exporter did not finish within {timeout_s:.0f} s"
    if error is None:
        try:
            size, sha256 = storage.sha256_of(storage.join(claimed.uri, exports.WEIGHTS_FILE))
        except FileNotFoundError:
            error = f"exporter wrote no {exports.WEIGHTS_FILE} under {claimed.uri}"
    with factory() as session:
        if error is None:
            recorded = exports.finish(
                session=session, claimed=claimed, size_bytes=size, sha256=sha256
            )
        else:
            log.warning("export %s failed: %s", export_id, error[-2000:])
            recorded = exports.fail(session=session, claimed=claimed, error=error)
        session.commit()
    if not recorded:
        log.warning("export %s was taken over by another worker; its outcome stands", export_id)
        return "superseded"
    return "ready" if error is None else "failed"
