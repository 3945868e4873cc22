"""Issue 30's whole path: a small Llama fine-tuned with LoRA through the service, with
`eval_after: [perplexity, generate, lm_eval]`; the worker runs the training job, then the two
eval jobs it made (its final checkpoint and its starting weights); the scores are read over
REST, with the CLI, and on the job page and the compare view in Chromium, the base model's
beside the trained one's. And an eval job's own page (issue 45, item 3), its run written
through the core services a worker uses (`tests.integration.eval_jobs`), at 1366x768 light and
dark: its scores lead, with the source job and checkpoint linked; no chart of one point, no
checkpoints, no "trained"."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine
from typer.testing import CliRunner

from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, Dash, new_dash
from tests.integration.eval_jobs import add_checkpoint, run_eval_job
from tests.integration.workers.helpers import (
    Worker,
    metric_series,
    tiny_spec,
    unique_queue,
    wait_state,
)
from tests.support.training import tiny_llama_dir
from torchyard.cli import app

RUN_S = 240.0
TERMINAL = ("succeeded", "failed", "cancelled")
STEPS = 8


def _qa_dataset(api: httpx.Client) -> str:
    records = [{"prompt": f"def f{i}(", "completion": f"x{i}): return x{i}"} for i in range(4)]
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    answer = api.post(
        "/v1/datasets/upload", data={"name": "qa"}, files={"file": ("qa.jsonl", body)}
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _spec(pool: str, dataset_id: str, qa: str, llama: Path) -> dict[str, Any]:
    """LoRA on the Llama saved at `llama` (under a data root: weights to adapt)."""
    spec = tiny_spec(
        pool=pool,
        dataset_id=dataset_id,
        name="llama-lora",
        model={"kind": "hf", "hf": {"path_or_id": str(llama)}, "seq_len": 64},
        lora={"r": 4, "alpha": 8.0},
        optim={"lr": 1e-2, "warmup_steps": 0},
        train={"max_steps": STEPS, "micro_batch_size": 8},
        eval={"interval_steps": STEPS, "num_batches": 1, "at_start": True},
        checkpoint={"interval_steps": STEPS},
        sample={"max_new_tokens": 4},
    ).model_dump(mode="json", exclude_none=True)
    task = {
        "task": "qa_ll",
        "dataset": qa,
        "output_type": "loglikelihood",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{completion}}",
        "metric_list": [{"metric": "perplexity"}, {"metric": "acc"}],
    }
    spec["eval_after"] = [
        "perplexity",
        {"kind": "generate", "name": "qa", "dataset": qa, "max_prompts": 2, "max_new_tokens": 6},
        {"kind": "lm_eval", "name": "harness", "tasks": [task]},
    ]
    return spec


@pytest.mark.timeout(900)
def test_a_lora_llama_with_eval_after_shows_its_scores_beside_the_base_models_everywhere(
    browser: Browser,
    live_api: str,
    owner: ProjectKey,
    api: httpx.Client,
    engine: Engine,
    dataset_id: str,
    worker: Worker,
    models_root: Path,
) -> None:
    qa = _qa_dataset(api)
    llama = tiny_llama_dir(models_root / "e2e-evals-llama")
    created = api.post("/v1/jobs", json=_spec(worker.queue, dataset_id, qa, llama))
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    done = wait_state(engine, job_id, TERMINAL, RUN_S, worker)
    assert done.state == "succeeded", done.error
    listed = api.get("/v1/jobs", params={"limit": 100}).json()["items"]
    made = {
        j["labels"]["eval_at"]: j["id"] for j in listed if j["labels"].get("eval_of") == str(job_id)
    }
    assert set(made) == {"initial", str(STEPS)}
    for eval_job in made.values():
        ended = wait_state(engine, eval_job, TERMINAL, RUN_S, worker)
        assert ended.state == "succeeded", ended.error

    # REST: three evaluations at two points, the base's loss the trainer's own at step 0
    items = api.get(f"/v1/jobs/{job_id}/evals").json()["items"]
    found = {(e["name"], e["step"]): e for e in items}
    assert set(found) == {(n, s) for n in ("perplexity", "qa", "harness") for s in (0, STEPS)}
    eval_loss = {p.step: p.value for p in metric_series(engine, job_id, "eval_loss")}
    for step in (0, STEPS):
        assert found[("perplexity", step)]["metrics"]["loss"] == pytest.approx(
            eval_loss[step], rel=1e-5
        )
    assert found[("perplexity", 0)]["checkpoint_id"] is None
    assert {"qa_ll/perplexity", "qa_ll/acc"} <= set(found[("harness", STEPS)]["metrics"])
    assert len(found[("qa", STEPS)]["samples"]) == 2

    # the CLI
    env = {"TORCHYARD_URL": live_api, "TORCHYARD_API_KEY": owner.api_key, "COLUMNS": "200"}
    shown = CliRunner().invoke(app, ["evals", str(job_id)], env=env)
    assert shown.exit_code == 0, shown.output
    assert " base " in shown.output and "qa_ll/acc" in shown.output, shown.output

    # the dashboard: the job page's card, its answers, and the compare view's rows
    with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
        page = dash.page
        dash.open(f"/jobs/{job_id}")
        row = page.locator("#evals-table tr[data-score='perplexity.loss']")
        base = found[("perplexity", 0)]["metrics"]["loss"]
        trained = found[("perplexity", STEPS)]["metrics"]["loss"]
        expect(row.locator("td[data-column='base'] a")).to_have_attribute(
            "href", f"#/jobs/{made['initial']}"
        )
        expect(row.locator(f"td[data-column='step {STEPS}'] a")).to_have_attribute(
            "href", f"#/jobs/{made[str(STEPS)]}"
        )
        expect(row.locator("td[data-change]")).to_have_class(
            "num better" if trained < base else "num worse"
        )
        expect(page.locator("#evals-table tr[data-score='harness.qa_ll/acc']")).to_be_visible()
        answers = page.locator("#evals-answers details[data-eval='qa']")
        answers.locator("summary").click()
        expect(answers.locator("tr[data-sample]")).to_have_count(2)
        expect(answers).to_contain_text("x0): return x0")
        expect(answers).to_contain_text("answer (base)")
        assert dash.fits_width()
        dash.shot("job-evals")
        dash.open(f"/compare?ids={job_id}")
        expect(page.locator("#compare-diff tr[data-eval-score='perplexity.loss']")).to_be_visible()


def test_an_eval_jobs_page_leads_with_its_scores_and_linked_source_and_charts_no_single_point(
    laptop_scheme: Dash, api: httpx.Client, engine: Engine, dataset_id: str
) -> None:
    pool = unique_queue("nowhere")  # no worker: the runs are written as a worker writes them
    source_spec = tiny_spec(pool=pool, dataset_id=dataset_id, name="source")
    created = api.post("/v1/jobs", json=source_spec.model_dump(mode="json", exclude_none=True))
    assert created.status_code == 201, created.text
    source = created.json()["id"]
    checkpoint = add_checkpoint(engine, source, STEPS)
    made = {}
    for name, at in (("scored", {"job": source}), ("base", {"job": source, "initial": True})):
        spec = {"name": name, "resources": {"pool": pool},
                "evaluate": {"source": at, "evaluations": [{"kind": "perplexity"}]}}  # fmt: skip
        answer = api.post("/v1/jobs", json=spec)
        assert answer.status_code == 201, answer.text
        made[name] = answer.json()["id"]
    run_eval_job(engine, made["base"], 0, {"perplexity": {"loss": 3.5, "perplexity": 33.12}})
    run_eval_job(engine, made["scored"], STEPS, {"perplexity": {"loss": 2.5, "perplexity": 12.18}})
    eval_job = made["scored"]

    page = laptop_scheme.page
    laptop_scheme.open(f"/jobs/{eval_job}")
    expect(page.locator("#job-kind [data-kind='eval']")).to_have_text("eval")
    scores = page.locator("#evals")
    expect(scores.locator("h2")).to_have_text("Scores")
    expect(scores).to_be_in_viewport()  # the page leads with them, above any metric
    assert page.evaluate(
        "document.getElementById('evals').compareDocumentPosition("
        "document.getElementById('metric-values-box')) & Node.DOCUMENT_POSITION_FOLLOWING"
    )
    row = scores.locator("#evals-table tr[data-score='perplexity.loss']")
    expect(row.locator(f"td[data-column='step {STEPS}']")).to_have_text("2.5")
    expect(row.locator(f"td[data-column='step {STEPS}'] a")).to_have_count(0)  # not itself
    expect(row.locator("td[data-column='base'] a")).to_have_attribute(
        "href", f"#/jobs/{made['base']}"
    )
    expect(row.locator("td[data-change]")).to_have_text("-1")
    expect(row.locator("td[data-change]")).to_have_class("num better")
    expect(scores.locator(f"a[href='#/jobs/{eval_job}']")).to_have_count(0)
    expect(scores.locator("#eval-source-job")).to_have_attribute("href", f"#/jobs/{source}")
    to_checkpoint = scores.locator("#eval-source-checkpoint")
    expect(to_checkpoint).to_have_attribute("href", f"#/jobs/{source}?checkpoint={checkpoint}")
    expect(to_checkpoint).to_have_text(f"checkpoint {checkpoint} (step {STEPS})")

    # one point per series: numbers, not charts; the scores only in the Scores card
    expect(page.locator("#metric-values dd[data-metric='sys/rss_bytes/0']")).to_have_text("1.2 GB")
    expect(page.locator("#metric-values dd[data-metric='perplexity.loss']")).to_have_count(0)
    expect(page.locator(".chart")).to_have_count(0)
    expect(page.locator("#metrics-toolbar")).to_be_hidden()
    # no checkpoints of its own, and it ran rather than trained
    expect(page.locator("#checkpoints-section")).to_have_count(0)
    summary = page.locator("#job-summary")
    expect(summary.locator("dd[data-field='kind']")).to_have_text("eval")
    expect(summary.locator("dd[data-field='ran']")).to_have_text(re.compile(r"^2s"))
    expect(summary.locator("dd[data-field='trained']")).to_have_count(0)
    expect(summary.locator("dd[data-field='progress']")).to_have_count(0)
    expect(summary.locator("dd[data-field='source'] #eval-source-job")).to_have_attribute(
        "href", f"#/jobs/{source}"
    )
    expect(page.locator("#events")).to_contain_text("evaluation completed")
    assert laptop_scheme.fits_width()
    laptop_scheme.shot("eval-job")

    to_checkpoint.click()  # the source's page, on the checkpoint scored
    expect(page.locator(f"#checkpoints tr#checkpoint-{checkpoint}.chosen")).to_be_visible()

    laptop_scheme.open("/jobs")  # the list marks it, as it marks a script job
    expect(page.locator(f"tr[data-job-id='{eval_job}'] .kind-eval")).to_have_text("eval")
    expect(page.locator(f"tr[data-job-id='{source}'] .kind-eval")).to_have_count(0)
