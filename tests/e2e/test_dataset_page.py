"""The dataset page in a real browser, at 1366x768: stats from `GET /v1/datasets/{id}` and the
mask preview, whose tokens are coloured by mask bit (issue 11: "the dashboard shows them
coloured, so a user sees what the model will learn from"). Waits are Playwright's, no sleeps."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from playwright.sync_api import Browser, expect

from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, WAIT_MS, Dash, new_dash
from tests.integration.conftest import UNSERVED_POOL

CHAT = [
    {
        "messages": [
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": f"What is {i} + {i}?"},
            {"role": "assistant", "content": f"Answer {2 * i}."},
        ]
    }
    for i in range(3)
]
# The first preview of a fresh API process imports `transformers` (seconds; more on a loaded
# host): the page's own wait budget, not `expect`'s 5 s default.
PREVIEW_MS = WAIT_MS
ACCEPTED = "POST /v1/jobs would accept this spec."
# Each span's class, role and text, in order, for one previewed example.
SPANS = """el => [...el.querySelectorAll('pre.tokens span.tok')]
  .map(s => [s.className, s.dataset.role, s.textContent])"""


@pytest.fixture
def chat_dataset(api: httpx.Client) -> dict[str, Any]:
    """A messages dataset uploaded for this test (a name of its own: `owner` may be shared)."""
    body = b"".join(orjson.dumps(r) + b"\n" for r in CHAT)
    answer = api.post(
        "/v1/datasets/upload",
        data={"name": f"chat-{secrets.token_hex(4)}"},
        files={"file": ("chat.jsonl", body, "application/octet-stream")},
    )
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


@pytest.fixture
def laptop(browser: Browser, live_api: str, owner: ProjectKey) -> Iterator[Dash]:
    with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
        yield dash


def test_the_preview_colours_assistant_tokens_supervised_and_user_tokens_not(
    laptop: Dash, chat_dataset: dict[str, Any]
) -> None:
    page = laptop.page
    laptop.open("/datasets")
    link = page.locator(f"#datasets-body tr[data-dataset-id='{chat_dataset['id']}'] a")
    expect(link).to_have_text(chat_dataset["name"])
    # The link's target, then opened: a click once landed before the page took it (CI at
    # 6542168: the hash stayed #/datasets), and what is tested here is the dataset's page.
    expect(link).to_have_attribute("href", f"#/datasets/{chat_dataset['id']}")
    laptop.open(f"/datasets/{chat_dataset['id']}")
    expect(page.locator("#dataset-name")).to_have_text(chat_dataset["name"])
    stats = page.locator("#dataset-stats")
    expect(stats.locator("dd[data-stat='Format']")).to_have_text("messages")
    expect(stats.locator("dd[data-stat='Records']")).to_have_text("3")
    expect(stats.locator("dd[data-stat='Messages']")).to_have_text("assistant 3, system 3, user 3")
    expect(stats.locator("dd[data-stat='Chars (supervised)']")).to_contain_text("p50")

    page.select_option("#preview-template", "chatml")
    page.fill("#preview-n", "2")
    page.click("#preview-run")
    expect(page.locator("#preview-verdict")).to_have_class("verdict verdict-ok", timeout=PREVIEW_MS)
    examples = page.locator(".preview-example")
    expect(examples).to_have_count(2)
    for i in range(2):
        spans = examples.nth(i).evaluate(SPANS)
        supervised = "".join(text for cls, _, text in spans if cls == "tok supervised")
        assert supervised == f"Answer {2 * i}.<|im_end|>"
        user = [(cls, text) for cls, role, text in spans if role == "user"]
        assert user and all(cls == "tok unsupervised" for cls, _ in user)
        assert f"What is {i} + {i}?" in "".join(text for _, text in user)
        assert {role for cls, role, _ in spans if cls == "tok supervised"} == {"assistant"}
    title = examples.first.locator("span.tok.supervised").first.get_attribute("title")
    assert title is not None and title.startswith("assistant · id ")
    expect(page.locator("#preview-roles tr[data-role='assistant'] td").last).to_have_text("100.0%")
    assert laptop.fits_width()
    laptop.shot("dataset-preview", full_page=True)


def test_a_refused_sample_shows_the_jobs_reason(laptop: Dash, chat_dataset: dict[str, Any]) -> None:
    page = laptop.page
    laptop.open(f"/datasets/{chat_dataset['id']}")
    page.wait_for_selector("main[data-loaded]")
    page.fill("#preview-seq-len", "8")
    page.select_option("#preview-truncation", "truncate_right")
    page.click("#preview-run")
    verdict = page.locator("#preview-verdict")
    expect(verdict).to_have_class("verdict verdict-refused", timeout=PREVIEW_MS)
    expect(verdict).to_contain_text("lose every supervised token to truncation")


def test_the_preview_in_dark_mode_fits_a_laptop_and_keeps_supervised_tokens_marked(
    browser: Browser, live_api: str, owner: ProjectKey, chat_dataset: dict[str, Any]
) -> None:
    with new_dash(browser, live_api, owner.api_key, color_scheme="dark", viewport=LAPTOP) as dash:
        dash.open(f"/datasets/{chat_dataset['id']}")
        dash.page.wait_for_selector("main[data-loaded]")
        dash.page.select_option("#preview-template", "chatml")
        dash.page.click("#preview-run")
        first = dash.page.locator(".preview-example pre.tokens span.tok.supervised").first
        expect(first).to_be_visible(timeout=PREVIEW_MS)
        background = first.evaluate("el => getComputedStyle(el).backgroundColor")
        plain = dash.page.locator("span.tok.unsupervised").first.evaluate(
            "el => getComputedStyle(el).backgroundColor"
        )
        assert background != plain, (background, plain)  # the mask bit is visible
        assert dash.fits_width()


def test_the_list_and_the_page_show_the_id_a_spec_takes_and_a_name_opens_the_page(
    laptop: Dash, chat_dataset: dict[str, Any]
) -> None:
    """Issue 28, item 2: the id (`ds_...`) is on the list and the page, with a Copy button
    that puts it on the clipboard; the page opens by the dataset's name too."""
    page = laptop.page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    laptop.open("/datasets")
    row = page.locator(f"#datasets-body tr[data-dataset-id='{chat_dataset['id']}']")
    expect(row.locator("code.dataset-id")).to_have_text(chat_dataset["id"])
    row.locator("button.copy").click()
    page.wait_for_function(
        f"async () => (await navigator.clipboard.readText()) === {chat_dataset['id']!r}"
    )
    assert laptop.fits_width()
    laptop.open(f"/datasets/{chat_dataset['name']}")
    expect(page.locator("#dataset-id")).to_have_text(chat_dataset["id"])
    expect(page.locator("#dataset-ref")).to_contain_text(f"data.dataset: {chat_dataset['name']}")


def test_the_page_shows_files_a_sample_the_jobs_that_used_it_and_starts_a_job_on_it(
    laptop_scheme: Dash, api: httpx.Client, chat_dataset: dict[str, Any]
) -> None:
    """Issue 28, item 2: the dataset's files, its first records as a job reads them, the jobs
    whose spec names it (linked), and "Use in a new job": the editor opens on a spec that
    names it (by name) and that the API finds nothing wrong with."""
    spec = {"name": "used-chat", "data": {"dataset": chat_dataset["name"]},
            "resources": {"pool": UNSERVED_POOL}}  # fmt: skip
    job = api.post("/v1/jobs", json=spec)
    assert job.status_code == 201, job.text
    try:  # cancelled after: a queued job of the shared pool moves others' queue positions
        _page_of_a_used_dataset(laptop_scheme, chat_dataset, job.json()["id"])
    finally:
        api.post(f"/v1/jobs/{job.json()['id']}/cancel")


def _page_of_a_used_dataset(laptop: Dash, chat_dataset: dict[str, Any], job_id: int) -> None:
    page = laptop.page
    laptop.open(f"/datasets/{chat_dataset['id']}")
    page.wait_for_selector("main[data-loaded]")
    expect(page.locator("#dataset-files tr[data-path='chat.jsonl'] td.num")).to_have_text(
        f"{chat_dataset['size_bytes']} B"
    )
    records = page.locator("#dataset-sample .sample-record")
    expect(records).to_have_count(len(CHAT))
    expect(records.first).to_have_attribute("data-where", "chat.jsonl:1")
    shown = orjson.loads(records.nth(2).locator("pre").inner_text())
    assert shown == CHAT[2]
    used = page.locator(f"#dataset-jobs tr[data-job-id='{job_id}'] a").first
    expect(used).to_have_attribute("href", f"#/jobs/{job_id}")
    assert laptop.fits_width()
    laptop.shot("dataset-page", full_page=True)

    page.click("#dataset-use")
    expect(page.locator("#spec-errors li.ok")).to_have_text(ACCEPTED)  # the editor's check ran
    expect(page.locator("#spec-errors li")).to_have_count(1)
    editor = page.locator("#spec-editor")
    expect(editor).to_have_value(re.compile(rf"\n  dataset: {re.escape(chat_dataset['name'])}\n"))


def test_use_in_a_new_job_on_preference_pairs_starts_from_dpo(
    laptop: Dash, api: httpx.Client
) -> None:
    pairs = [{"prompt": f"Say {i}.", "chosen": f"{i}.", "rejected": "No."} for i in range(4)]
    answer = api.post(
        "/v1/datasets/upload",
        data={"name": f"pairs-{secrets.token_hex(4)}"},
        files={"file": ("pairs.jsonl", b"".join(orjson.dumps(p) + b"\n" for p in pairs))},
    )
    assert answer.status_code == 201, answer.text
    laptop.open(f"/submit?dataset={answer.json()['id']}")
    laptop.page.wait_for_selector("main[data-loaded] #spec-editor")
    text = laptop.page.locator("#spec-editor").input_value()
    assert "kind: dpo" in text and "packing: false" in text, text
    expect(laptop.page.locator("#spec-errors li.ok")).to_have_text(ACCEPTED)
    expect(laptop.page.locator("#spec-errors li")).to_have_count(1)


def test_a_directorys_files_that_are_not_text_are_named_on_its_page(
    laptop_scheme: Dash, api: httpx.Client
) -> None:
    """Issue 45, item 1: the page of a directory said "No warnings" while 64% of its bytes were
    binary. It shows the filter the directory was registered with and what was left out."""
    import sysconfig
    from pathlib import Path

    ensurepip = Path(sysconfig.get_paths()["stdlib"]) / "ensurepip"  # sources and two wheels
    caches = "*__pycache__/*"
    answer = api.post(
        "/v1/datasets",
        json={"name": f"pip-{secrets.token_hex(4)}", "uri": str(ensurepip), "exclude": [caches]},
    )
    assert answer.status_code == 201, answer.text
    ds = answer.json()
    left = ds["left_out"]
    wheels = sorted(p.relative_to(ensurepip).as_posix() for p in ensurepip.rglob("*.whl"))
    assert [e["path"] for e in left["examples"]] == wheels and wheels
    page = laptop_scheme.page
    laptop_scheme.open(f"/datasets/{ds['id']}")
    page.wait_for_selector("main[data-loaded]")
    stats = page.locator("#dataset-stats")
    expect(stats.locator("dd[data-stat='Include']")).to_have_text("**/*")
    expect(stats.locator("dd[data-stat='Exclude']")).to_have_text(caches)
    share = round(100 * left["bytes"] / left["of_bytes"])
    expect(page.locator("#dataset-left-out")).to_contain_text(
        f"Not UTF-8 text, never read by a job: {len(wheels)} of {left['of_files']} files, "
        f"{share}% of bytes"
    )
    files = page.locator("#dataset-left-out li.left-out-file")
    expect(files).to_have_count(len(wheels))
    expect(files.first).to_contain_text(wheels[0])
    expect(files.first).to_contain_text(left["examples"][0]["reason"].split(": ", 1)[1])
    assert laptop_scheme.fits_width()
