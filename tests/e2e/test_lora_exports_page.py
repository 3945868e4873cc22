"""A LoRA run's page offers what it wrote at its end (issue 45, item 2) in headless Chromium at
1366x768: its checkpoints refuse the checkpoint export, and under them its adapter and merged
model list their files, each a download fetched with the key. The run's end is recorded as a
worker's ingest records it (`export` events, the files in the storage); the real run and its
files are tests/integration/trainer/test_chat_sft_dpo.py's."""

from __future__ import annotations

from pathlib import Path

import httpx
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from core.jobs import service as jobs
from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from core.platform.tables import Checkpoint, JobState
from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, new_dash

FILES = {
    "adapter": {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": b"\x00" * 4096},
    "merged": {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\x01" * 8192},
}


def test_a_lora_runs_page_offers_its_adapter_and_merged_model_file_by_file(
    browser: Browser,
    live_api: str,
    owner: ProjectKey,
    api: httpx.Client,
    dataset_id: str,
    engine: Engine,
    settings: Settings,
    tmp_path: Path,
) -> None:
    base = {"name": "src", "data": {"dataset": dataset_id}, "train": {"max_steps": 20},
            "resources": {"pool": "dash-lora-unserved"}}  # fmt: skip
    source = api.post("/v1/jobs", json=base).json()
    with session_scope(engine) as s:  # the weights the run adapts
        s.add(Checkpoint(job_id=source["id"], attempt=1, step=20, uri="/nowhere"))
    lora = {**base, "name": "lora", "model": {"init_from": {"job": source["id"]}}, "lora": {"r": 8}}
    answer = api.post("/v1/jobs", json=lora)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    root = Path(job_checkpoint_uri(settings, job_id)) / "lora" / "step_00000020"
    with session_scope(engine) as s:
        job = jobs.claim(session=s, job_id=job_id, worker="w")
        assert job is not None
        jobs.transition(session=s, job_id=job_id, to=JobState.RUNNING)
        for kind, fmt in (("adapter", "peft_adapter"), ("merged", "merged_safetensors")):
            (root / kind).mkdir(parents=True)
            for name, data in FILES[kind].items():
                (root / kind / name).write_bytes(data)
            where = {"step": 20, "format": fmt, "uri": str(root / kind), "size_bytes": 0}
            jobs.add_event(session=s, job=job, kind="info", data=where,
                           message=f"exported {fmt} at step 20")  # fmt: skip
        s.add(Checkpoint(job_id=job_id, attempt=1, step=20, uri=str(root.parent.parent)))
        jobs.transition(session=s, job_id=job_id, to=JobState.SUCCEEDED)
    with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
        page = dash.page
        dash.open(f"/jobs/{job_id}")
        page.wait_for_selector("#lora-exports p[data-lora='merged']")
        expect(page.locator("#checkpoints td.export")).to_have_text("\u2013")  # refused: adapters
        adapter = page.locator("#lora-exports p[data-lora='adapter']")
        expect(adapter).to_contain_text("LoRA adapter (PEFT) at step 20")
        assert adapter.locator("a.lora-file").all_inner_texts() == [
            "adapter_config.json (8 B)",
            "adapter_model.safetensors (4.1 kB)",
        ]
        with page.expect_download() as fetched:
            adapter.locator("a[data-file='adapter_model.safetensors']").click()
        saved = tmp_path / "got.safetensors"
        fetched.value.save_as(saved)
        assert saved.read_bytes() == FILES["adapter"]["adapter_model.safetensors"]
        assert fetched.value.suggested_filename == "adapter_model.safetensors"
        assert dash.fits_width()
