"""Browser tests: Debian's Chromium driven by Playwright against a real API and a real worker.

Chromium comes from the system (`scripts/browser.sh` installs Debian's `chromium`); Playwright is
told its path and never downloads a browser of its own. A missing Chromium fails these tests
loudly instead of skipping them. Every page fails its test on a console error or an uncaught
exception, except the HTTP statuses a test declares it expects (a 422 for a bad spec, ...).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, expect, sync_playwright
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import ProjectKey, make_project
from tests.integration.conftest import live_api  # noqa: F401  (the real uvicorn server)
from tests.integration.workers.helpers import (
    Worker,
    own_worker,
    unique_queue,
)

CHROMIUM = os.environ.get("TORCHYARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
VIEWPORT = {"width": 1280, "height": 800}
LAPTOP = {"width": 1366, "height": 768}  # the most common laptop screen
# The README's screenshots are refreshed only on request (`TORCHYARD_SCREENSHOTS=docs/screenshots`):
# an ordinary run writes them to a temp dir, so the tests never dirty the tracked files.
SCREENSHOTS = Path(
    os.environ.get("TORCHYARD_SCREENSHOTS") or tempfile.mkdtemp(prefix="torchyard-screenshots-")
).resolve()
WAIT_MS = 30_000
# Actions wait WAIT_MS (the context's default timeout) but `expect` has its own default of 5 s,
# too short on a CI host running four test processes, trainers and Chromium: the same bound.
expect.set_options(timeout=WAIT_MS)
_RESOURCE_STATUS = re.compile(r"status of (\d{3})")


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """Headless Debian Chromium; fails (not skips) when it is not installed.

    Package-scoped: Playwright's sync API marks an asyncio loop as running in the main thread
    while it is started, which would break the `asyncio.run` of tests collected after these."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/browser.sh (apt-get install chromium)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@dataclass
class Console:
    """Console errors and uncaught exceptions of one page; `expect_status` allows an HTTP error."""

    errors: list[str] = field(default_factory=list)
    allowed_statuses: set[int] = field(default_factory=set)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        status = _RESOURCE_STATUS.search(message.text)
        if status and int(status.group(1)) in self.allowed_statuses:
            return
        self.errors.append(f"console: {message.text} at {message.location}")

    def on_page_error(self, error: Error) -> None:
        self.errors.append(f"page error: {error}")

    def expect_status(self, *statuses: int) -> None:
        self.allowed_statuses.update(statuses)


@dataclass
class Dash:
    """One browser page on the dashboard of `live_api`, and its console."""

    page: Page
    base_url: str
    console: Console

    def open(self, route: str) -> None:
        self.page.goto(f"{self.base_url}/ui/#{route}")

    def fits_width(self) -> bool:
        """The page needs no horizontal scrolling at this viewport."""
        return bool(self.page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))

    def shot(self, name: str, full_page: bool = False) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)


@contextmanager
def new_dash(
    browser: Browser,
    base_url: str,
    api_key: str | None,
    color_scheme: str = "light",
    viewport: dict[str, int] | None = None,
    timezone_id: str | None = None,
    locale: str | None = None,
) -> Iterator[Dash]:
    """A fresh browser context (cold cache) on the dashboard; asserts no console errors at exit.
    `timezone_id` and `locale` (e.g. "Europe/Berlin", "de-DE"): the browser's, else the host's."""
    context = browser.new_context(
        viewport=viewport or VIEWPORT,  # type: ignore[arg-type]
        color_scheme=color_scheme,  # type: ignore[arg-type]
        timezone_id=timezone_id,
        locale=locale,
    )
    context.set_default_timeout(WAIT_MS)
    if api_key is not None:  # signed in already, as after the sign-in form
        context.add_init_script(f"sessionStorage.setItem('torchyard.apiKey', {api_key!r})")
    page = context.new_page()
    console = Console()
    page.on("console", console.on_console)
    page.on("pageerror", console.on_page_error)
    try:
        yield Dash(page=page, base_url=base_url, console=console)
        assert not console.errors, "\n".join(console.errors)
    finally:
        context.close()


@pytest.fixture
def owner(engine: Engine) -> ProjectKey:
    """A project of the test's own, whose jobs its pages show (no test sees another's jobs)."""
    return make_project(engine)


@pytest.fixture(params=["light", "dark"])
def laptop_scheme(
    request: pytest.FixtureRequest,
    browser: Browser,
    live_api: str,  # noqa: F811
    owner: ProjectKey,
) -> Iterator[Dash]:
    """The dashboard at 1366x768 (the most common laptop), once light and once dark."""
    with new_dash(browser, live_api, owner.api_key, request.param, LAPTOP) as dash:
        yield dash


@pytest.fixture
def dash(browser: Browser, live_api: str, owner: ProjectKey) -> Iterator[Dash]:  # noqa: F811
    """A signed-in page (fresh context) that fails the test on a console error."""
    with new_dash(browser, live_api, owner.api_key) as dash:
        yield dash


@pytest.fixture
def guest(browser: Browser, live_api: str) -> Iterator[Dash]:  # noqa: F811
    """A page that has not signed in."""
    with new_dash(browser, live_api, None) as dash:
        yield dash


@contextmanager
def api_client(base_url: str, project: ProjectKey) -> Iterator[httpx.Client]:
    """An HTTP client of the API signed in as `project`."""
    with httpx.Client(base_url=base_url, headers=project.headers, timeout=30) as client:
        yield client


def register_corpus(api: httpx.Client, corpus_dir: Path) -> str:
    """Register `corpus_dir` as a dataset of `api`'s project; returns its id."""
    answer = api.post("/v1/datasets", json={"name": "corpus", "uri": str(corpus_dir)})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


@pytest.fixture
def api(live_api: str, owner: ProjectKey) -> Iterator[httpx.Client]:  # noqa: F811
    with api_client(live_api, owner) as client:
        yield client


@pytest.fixture
def dataset_id(api: httpx.Client, corpus_dir: Path) -> str:
    return register_corpus(api, corpus_dir)


@pytest.fixture(scope="module")
def pool() -> str:
    return unique_queue("dash")


@pytest.fixture(scope="module")
def worker(
    settings: Settings, pool: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    with own_worker(
        settings, pool, tmp_path_factory.mktemp("dash"), app_name="torchyard-dash"
    ) as started:
        yield started


@pytest.fixture(scope="module")
def exporter(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """`torchyard exporter`'s worker, for the checkpoint exports a page asks for."""
    with own_worker(
        settings,
        settings.export_queue,
        tmp_path_factory.mktemp("exports"),
        app_name="torchyard-dash-exports",
        exporter=True,
    ) as started:
        yield started
