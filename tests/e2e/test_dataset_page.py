"""The dataset page in a real browser, at 1366x768: stats from `GET /v1/datasets/{id}` and the
mask preview, whose tokens are coloured by mask bit (issue 11: "the dashboard shows them
coloured, so a user sees what the model will learn from"). Waits are Playwright's, no sleeps."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from playwright.sync_api import Browser, expect

from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, WAIT_MS, Dash, new_dash

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
    link.click()
    page.wait_for_selector("main[data-loaded]")
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
