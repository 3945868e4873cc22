"""A client generated from the live server's `/openapi.json` by a standard generator
(openapi-python-client) compiles, imports, and submits a job and reads it back.

The generator runs offline, from the document saved to a file, out of its own virtual
environment (`.venv/sdkgen`, made by scripts/setup.sh: it pins an older typer than the CLI's).
It must find nothing to report about the document but the known limits in KNOWN_WARNINGS.
"""

from __future__ import annotations

import compileall
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.integration.api.conftest import job_spec

GENERATOR = Path(sys.prefix) / "sdkgen" / "bin" / "openapi-python-client"
PACKAGE = "torchyard_sdk"
# (where, what the generator says) -> why it is fine.
KNOWN_WARNINGS = {
    ("POST /v1/spec/validate", "Unsupported content type application/yaml"): "the generator "
    "writes JSON, form and byte bodies only; the operation's JSON body is generated",
}
_WARNING = re.compile(r"^WARNING parsing (\S+ \S+) within \S+\.\n\n(.+)$", re.MULTILINE)
_UNPROCESSED = re.compile(r"^Unable to process schema (\S+):\n\n(.+)$", re.MULTILINE)


def _generate(document: str, root: Path) -> str:
    """Generate the client package `root/PACKAGE` from `document`; the generator's report."""
    (root / "openapi.json").write_text(document)
    (root / "config.yaml").write_text(f"package_name_override: {PACKAGE}\n")
    assert GENERATOR.exists(), f"{GENERATOR} is missing: run scripts/setup.sh"
    command = [
        str(GENERATOR), "generate", "--path", str(root / "openapi.json"),
        "--output-path", str(root / PACKAGE), "--meta", "none",
        "--config", str(root / "config.yaml"),
    ]  # fmt: skip
    # Its post hooks format the code with the `ruff` of its own environment.
    env = {**os.environ, "PATH": f"{GENERATOR.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def sdk(live_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The generated package's modules by dotted name, every one imported."""
    root = tmp_path_factory.mktemp("sdk")
    # The first /openapi.json builds the schema: seconds on a loaded host, past httpx's 5 s.
    report = _generate(httpx.get(f"{live_api}/openapi.json", timeout=60.0).text, root)
    reported = {(where, what.strip()) for where, what in _WARNING.findall(report)}
    assert reported <= set(KNOWN_WARNINGS), report
    assert not _UNPROCESSED.findall(report), report
    with warnings.catch_warnings():
        warnings.simplefilter("error", SyntaxWarning)  # code a later Python may refuse
        assert compileall.compile_dir(root / PACKAGE, quiet=1, force=True)
    sys.path.insert(0, str(root))
    try:
        package = importlib.import_module(PACKAGE)
        modules: dict[str, ModuleType] = {PACKAGE: package}
        for info in pkgutil.walk_packages(package.__path__, f"{PACKAGE}."):
            modules[info.name] = importlib.import_module(info.name)
        yield modules
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def test_generated_client_submits_a_job_and_reads_it_back(
    sdk: dict[str, Any], live_api: str, api_key: str, dataset: dict[str, Any], pool: str
) -> None:
    models = sdk[f"{PACKAGE}.models"]
    create, get = sdk[f"{PACKAGE}.api.jobs.jobs_create"], sdk[f"{PACKAGE}.api.jobs.jobs_get"]
    spec = models.JobSpec.from_dict(job_spec(dataset["id"], name="sdk", resources={"pool": pool}))
    with sdk[PACKAGE].AuthenticatedClient(base_url=live_api, token=api_key) as client:
        created = create.sync_detailed(client=client, body=spec)
        assert created.status_code == 201, created.content
        job = created.parsed
        assert isinstance(job, models.Job)
        assert (job.name, job.state, job.pool) == ("sdk", models.JobState.QUEUED, pool)

        read = get.sync(job_id=job.id, client=client)
        assert isinstance(read, models.Job)
        assert read.id == job.id
        assert isinstance(read.spec, models.JobSpec)
        assert (read.spec.data.dataset, read.spec.train.max_steps) == (dataset["id"], 20)

        missing = get.sync(job_id=job.id + 10**9, client=client)
        assert isinstance(missing, models.ErrorBody)
        assert missing.error.code == "not_found"
