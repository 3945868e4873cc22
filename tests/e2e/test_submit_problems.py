"""The editor lists every problem of a spec at once (issue 28, item 1), in a real Chromium at
1366x768, light and dark: a bad field, a rule across fields it used to hide, an unknown field with
the one it most likely meant, and a dataset the project lacks, each at its line."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect

from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, new_dash

SPEC = """name: five
data:
  dataset: ds_nope000000000000
model:
  n_heads: 3
  d_model: 128
optim:
  learning_rate: 0.01
train:
  max_steps: -5
"""
# data-loc of each problem -> (its line in SPEC, words of its message)
PROBLEMS = {
    "optim.learning_rate": (8, "did you mean `optim.lr`?"),
    "train.max_steps": (10, "greater than or equal to 1"),
    "model.n_heads": (5, "n_heads (3) must divide d_model (128)"),
    "data.dataset": (3, "no dataset 'ds_nope000000000000'"),
}


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_editor_shows_every_problem_of_a_spec_at_once_with_its_line(
    browser: Browser, live_api: str, owner: ProjectKey, scheme: str
) -> None:
    with new_dash(browser, live_api, owner.api_key, color_scheme=scheme, viewport=LAPTOP) as dash:
        page = dash.page
        dash.console.expect_status(422)
        dash.open("/submit")
        page.wait_for_selector("main[data-loaded]")
        page.fill("#spec-editor", SPEC)
        for loc, (line, words) in PROBLEMS.items():
            item = page.locator(f"#spec-errors li[data-loc='{loc}']")
            expect(item).to_contain_text(words)
            expect(item.locator("a.line")).to_have_text(f" line {line}")
        expect(page.locator("#spec-errors li")).to_have_count(len(PROBLEMS))
        expect(page.locator(".code .gutter .bad")).to_have_count(len(PROBLEMS))
        assert dash.fits_width()
        dash.shot(f"submit-problems-{scheme}")
