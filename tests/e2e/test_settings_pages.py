"""The settings pages in a real browser at 1366x768, against the live API (issue 14, "Settings
pages: members and roles, keys, webhooks, quotas; all through the public REST API").

An admin adds a member, changes their role and removes them; creates a scoped key whose secret
(shown once) works against the API within its scope and answers 401 once revoked from the page;
gives a CI service account a `jobs:write` key that answers 401 once the account is disabled;
subscribes a webhook, pings it (the delivery loop is off in tests: the ping's delivery row
stays pending, which is what the log shows) and rotates its secret; and sets a quota. The
API's refusals (409, 403, 422 with its field path) show beside the form that caused them. A
viewer sees the same pages read-only. Waits are Playwright's, no sleeps."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy import Engine

from core.access import auth
from core.platform.db import session_scope
from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, Dash, new_dash

PUBLIC_URL = "http://93.184.215.14/torchyard-hook"  # a public address literal: no DNS lookup


@pytest.fixture
def admin(browser: Browser, live_api: str, owner: ProjectKey) -> Iterator[Dash]:
    with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
        yield dash


def open_section(dash: Dash, section: str) -> Page:
    page = dash.page
    page.click(f"#settings-nav a[data-section='{section}']")
    expect(page.locator("main")).to_have_attribute("data-section", section)
    page.wait_for_selector("main[data-loaded]")
    return page


def add_member_and_change_role(dash: Dash, api: httpx.Client) -> str:
    """Adds ada as a member, makes her a viewer from the row's select; 409 on adding twice."""
    page = dash.page
    dash.open("/jobs")
    page.click("#nav a[data-nav='settings']")
    expect(page.locator("main")).to_have_attribute("data-section", "members")
    page.fill("#member-subject", "ada@example.com")
    page.select_option("#member-role", "member")
    page.click("#member-form button[type=submit]")
    row = page.locator("#members-table tr[data-subject='ada@example.com']")
    expect(row.locator("select")).to_have_value("member")
    row.locator("select").select_option("viewer")
    expect(page.locator("#settings-body .done")).to_have_text("ada@example.com is now a viewer.")
    expect(row.locator("select")).to_have_value("viewer")  # as the reloaded list has it
    members = api.get("/v1/members").json()["items"]
    assert [(m["subject"], m["role"]) for m in members] == [("ada@example.com", "viewer")]
    dash.console.expect_status(409, 403, 422)
    page.fill("#member-subject", "ada@example.com")
    page.click("#member-form button[type=submit]")
    expect(page.locator("#member-form .form-errors")).to_contain_text("Conflict (409)")
    return str(members[0]["id"])


def create_scoped_key(dash: Dash, live_api: str) -> str:
    """A `jobs:read` key with an expiry: its secret shows once and reads but cannot write.
    A key for the viewer with the `admin` scope is refused (403) beside the form."""
    page = open_section(dash, "keys")
    page.fill("#key-name", "viewer-admin")
    page.select_option("#key-owner", label="member ada@example.com")
    page.check("#key-scopes input[value='admin']")
    page.click("#key-form button[type=submit]")
    expect(page.locator("#key-form .form-errors")).to_contain_text("Not allowed (403)")
    expect(page.locator("#key-secret")).to_have_count(0)
    page.fill("#key-name", "reader")
    page.select_option("#key-owner", "")
    page.uncheck("#key-scopes input[value='admin']")
    page.check("#key-scopes input[value='jobs:read']")
    page.select_option("#key-expiry", label="30 days")
    page.click("#key-form button[type=submit]")
    secret = page.locator("#key-secret").inner_text()
    assert secret.startswith("ty_")
    row = page.locator("#keys-table tr[data-name='reader']")
    expect(row.locator("td.scopes")).to_have_text("jobs:read")
    expect(row.locator("td.status")).to_have_text("active")
    expect(row.locator("td").nth(5)).not_to_have_text("never")  # expires in 30 days
    expect(page.locator("#key-role")).to_have_value("member")  # the form is back to its defaults
    assert secret.startswith(row.locator("code").inner_text().rstrip("…"))
    with httpx.Client(base_url=live_api, headers={"Authorization": f"Bearer {secret}"}) as key:
        assert key.get("/v1/jobs").status_code == 200
        refused = key.post("/v1/datasets", json={"name": "x", "uri": "/nowhere"})
        assert refused.status_code == 403, refused.text
    dash.shot("settings-keys")
    page.reload()  # the secret is shown once: not after a reload
    page.wait_for_selector("main[data-loaded]")
    expect(page.locator("#key-secret")).to_have_count(0)
    return secret


def revoke_key(dash: Dash, live_api: str, secret: str) -> None:
    page = dash.page
    revoke = page.locator("#keys-table tr[data-name='reader'] td.actions button")
    revoke.click()
    expect(revoke).to_have_text("Confirm revoke")
    revoke.click()
    expect(page.locator("#keys-table tr[data-name='reader'] td.status")).to_have_text("revoked")
    with httpx.Client(base_url=live_api, headers={"Authorization": f"Bearer {secret}"}) as key:
        assert key.get("/v1/jobs").status_code == 401


def service_account_key(dash: Dash, live_api: str) -> None:
    """A CI service account gets a `jobs:write` key; disabling the account makes it 401."""
    page = open_section(dash, "service-accounts")
    page.fill("#sa-name", "ci")
    page.select_option("#sa-role", "member")
    page.click("#sa-form button[type=submit]")
    expect(page.locator("#sa-table tr[data-name='ci'] td").nth(1)).to_have_text("member")
    page = open_section(dash, "keys")
    page.fill("#key-name", "ci-submit")
    page.select_option("#key-owner", label="service account ci")
    expect(page.locator("#key-role")).to_be_disabled()  # the owner's role holds
    page.check("#key-scopes input[value='jobs:write']")
    page.click("#key-form button[type=submit]")
    secret = page.locator("#key-secret").inner_text()
    row = page.locator("#keys-table tr[data-name='ci-submit']")
    expect(row.locator("td.owner")).to_have_text("service account ci")
    expect(row.locator("td.scopes")).to_have_text("jobs:write")
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=live_api, headers=headers) as key:
        assert key.get("/v1/jobs").status_code == 403  # jobs:write only, no jobs:read
        page = open_section(dash, "service-accounts")
        disable = page.locator("#sa-table tr[data-name='ci'] td.actions button")
        disable.click()
        disable.click()
        expect(page.locator("#sa-table tr[data-name='ci'] td").nth(3)).to_contain_text("disabled")
        assert key.get("/v1/jobs").status_code == 401


def rotate_and_remove(dash: Dash, api: httpx.Client, hook_id: str) -> None:
    """Rotating adds a secret (shown once); the old one is deleted from its chip."""
    page = dash.page
    row = page.locator(f"#webhooks-table tr[data-webhook-id='{hook_id}']")
    row.locator("button.rotate").click()
    expect(page.locator("#webhook-secret-value")).to_contain_text("whsec_")
    expect(row.locator("td.secrets .label")).to_have_count(2)
    (old, new) = api.get(f"/v1/webhooks/{hook_id}").json()["secrets"]
    row.locator(f"td.secrets [data-secret-id='{old['id']}'] button").click()
    expect(row.locator("td.secrets .label")).to_have_count(1)
    expect(row.locator(f"td.secrets [data-secret-id='{new['id']}']")).to_be_visible()


def remove_member(dash: Dash, api: httpx.Client) -> None:
    """Removes ada from her row; a row another admin removed meanwhile shows the API's 404
    above the list, which then reloads without it."""
    bob = api.post("/v1/members", json={"subject": "bob@example.com", "role": "viewer"}).json()
    page = open_section(dash, "members")
    assert api.delete(f"/v1/members/{bob['id']}").status_code == 200  # behind the page's back
    dash.console.expect_status(404)
    gone = page.locator("#members-table tr[data-subject='bob@example.com'] td.actions button")
    gone.click()
    gone.click()
    expect(page.locator("#settings-body > .form-errors")).to_contain_text("Not found (404)")
    expect(page.locator("#members-table tr[data-subject='bob@example.com']")).to_have_count(0)
    remove = page.locator("#members-table tr[data-subject='ada@example.com'] td.actions button")
    remove.click()
    remove.click()
    expect(page.locator("#settings-body .done")).to_have_text("ada@example.com was removed.")
    expect(page.locator("#members-table tr[data-subject]")).to_have_count(0)
    assert api.get("/v1/members").json()["items"] == []


def subscribe_and_ping(dash: Dash, api: httpx.Client) -> None:
    """A loopback URL is refused (422 at `body.url`, the field marked); a public one subscribes,
    shows its signing secret once, and a ping's pending delivery appears in its log."""
    page = open_section(dash, "webhooks")
    page.fill("#webhook-url", "http://127.0.0.1:9/hook")
    page.click("#webhook-form button[type=submit]")
    errors = page.locator("#webhook-form .form-errors")
    expect(errors.locator("li[data-loc='body.url']")).to_contain_text("loopback")
    expect(page.locator("#webhook-url")).to_have_attribute("aria-invalid", "true")
    page.fill("#webhook-url", PUBLIC_URL)
    page.check("#webhook-events input[value='checkpoint.saved']")
    page.click("#webhook-alerts summary")
    page.fill("#alert-loss-spike-factor", "1")  # the API's bound: > 1
    page.click("#webhook-form button[type=submit]")
    spike = errors.locator("li[data-loc='body.alert_rules.loss_spike_factor']")
    expect(spike).to_contain_text("greater than 1")
    expect(page.locator("#alert-loss-spike-factor")).to_have_attribute("aria-invalid", "true")
    page.fill("#alert-loss-spike-factor", "3")
    page.check("#alert-nan-loss")
    page.fill("#alert-stalled-minutes", "30")
    page.click("#webhook-form button[type=submit]")
    expect(page.locator("#webhook-secret-value")).to_contain_text("whsec_")
    expect(errors).to_be_hidden()
    expect(page.locator("#webhook-events input[value='job.*']")).to_be_checked()  # reset
    row = page.locator(f"#webhooks-table tr[data-url='{PUBLIC_URL}']")
    expect(row.locator("code.label")).to_have_text(["job.*", "checkpoint.saved"])
    (hook,) = api.get("/v1/webhooks").json()["items"]
    assert hook["event_types"] == ["job.*", "checkpoint.saved"]
    rules = hook["alert_rules"]
    assert (rules["nan_loss"], rules["loss_spike_factor"], rules["stalled_minutes"]) == (
        True,
        3.0,
        30.0,
    )
    expect(row.locator(".alert-rules")).to_have_text("alerts: NaN loss, spike 3x, stalled 30 min")
    row.locator("button.ping").click()
    delivery = page.locator(f"#deliveries-{hook['id']} tr[data-event-type='ping']")
    expect(delivery).to_have_attribute("data-status", "pending")
    expect(delivery.locator("td").nth(5)).to_have_text("0")  # attempts: no loop in tests
    (listed,) = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"]
    assert (listed["event_type"], listed["status"]) == ("ping", "pending")
    delivery.locator("button.redeliver").click()
    expect(page.locator(f"#deliveries-{hook['id']} tr[data-event-type='ping']")).to_have_count(1)
    assert dash.fits_width()
    dash.shot("settings-webhooks")
    rotate_and_remove(dash, api, hook["id"])


def set_quota(dash: Dash, api: httpx.Client) -> None:
    page = open_section(dash, "quotas")
    page.fill("#quota-pool", "dash-pool")
    page.fill("#quota-max-slots", "2")
    page.fill("#quota-max-queued-jobs", "10")
    page.click("#quota-form button[type=submit]")
    row = page.locator("#quotas-table tr[data-pool='dash-pool']")
    expect(row.locator("td").nth(1)).to_have_text("0 / 2")
    expect(row.locator("td").nth(3)).to_have_text("0 / 10")
    (quota,) = api.get("/v1/quotas").json()["items"]
    assert (quota["pool"], quota["max_slots"], quota["max_queued_jobs"]) == ("dash-pool", 2, 10)
    row.locator("button.edit").click()  # the form takes the row's values, to change one
    expect(page.locator("#quota-max-queued-jobs")).to_have_value("10")
    page.fill("#quota-max-slots", "3")
    page.click("#quota-form button[type=submit]")
    expect(row.locator("td").nth(1)).to_have_text("0 / 3")
    expect(row.locator("td").nth(3)).to_have_text("0 / 10")
    page.fill("#quota-pool", "dash-pool")
    page.fill("#quota-weight", "0")  # the API's bound: > 0
    page.click("#quota-form button[type=submit]")
    expect(page.locator("#quota-form .form-errors li[data-loc='body.weight']")).to_be_visible()


def test_an_admin_manages_members_keys_webhooks_and_quotas(
    admin: Dash, api: httpx.Client, live_api: str
) -> None:
    add_member_and_change_role(admin, api)
    secret = create_scoped_key(admin, live_api)
    revoke_key(admin, live_api, secret)
    assert admin.fits_width()
    service_account_key(admin, live_api)
    remove_member(admin, api)
    subscribe_and_ping(admin, api)
    set_quota(admin, api)
    admin.shot("settings-quotas")


def test_the_keys_table_marks_the_key_this_browser_signed_in_with(
    admin: Dash, api: httpx.Client, engine: Engine, owner: ProjectKey
) -> None:
    """Issue 45, item 9: two keys of the same name, and nothing said which one revoking would
    sign this browser out."""
    with session_scope(engine) as s:  # another admin key, named as the browser's
        auth.create_api_key(session=s, project_id=owner.project_id)
    mine = api.get("/v1/me").json()["key"]["id"]
    admin.open("/settings/keys")
    rows = admin.page.locator("#keys-table tbody tr")
    expect(rows).to_have_count(2)
    marked = admin.page.locator("#keys-table tr:has(.this-browser)")
    expect(marked).to_have_count(1)
    expect(marked).to_have_attribute("data-key-id", mine)
    expect(marked.locator(".this-browser")).to_have_text("this browser's key")


def test_a_viewer_sees_the_settings_read_only(
    browser: Browser, live_api: str, api: httpx.Client
) -> None:
    assert api.put("/v1/quotas/gpu", json={"max_slots": 4}).status_code == 200
    created = api.post("/v1/keys", json={"name": "viewer", "role": "viewer"})
    assert created.status_code == 201, created.text
    with new_dash(
        browser, live_api, created.json()["secret"], color_scheme="dark", viewport=LAPTOP
    ) as dash:
        page = dash.page
        dash.open("/settings")
        page.wait_for_selector("main[data-loaded]")
        expect(page.locator("main")).to_have_attribute("data-section", "quotas")
        expect(page.locator("#quotas-table tr[data-pool='gpu'] td").nth(1)).to_have_text("0 / 4")
        expect(page.locator("#quotas-read-only")).to_be_visible()
        expect(page.locator("#quota-form")).to_have_count(0)
        expect(page.locator("#quotas-table button")).to_have_count(0)
        for section in ("members", "service-accounts", "keys", "webhooks"):
            open_section(dash, section)
            expect(page.locator("#admin-only")).to_contain_text("viewer")
            expect(page.locator("#settings-body form")).to_have_count(0)
            expect(page.locator("#settings-body button")).to_have_count(0)
        assert dash.fits_width()
        dash.shot("settings-viewer-dark")


def test_an_org_admin_creates_a_project_whose_first_key_is_shown_once(
    browser: Browser, live_api: str, engine: Engine, owner: ProjectKey
) -> None:
    with session_scope(engine) as s:
        org_key = auth.create_api_key(session=s, project_id=owner.project_id, org_admin=True)
    name = f"dash-{owner.project_name}"
    with new_dash(browser, live_api, org_key, viewport=LAPTOP) as dash:
        page = dash.page
        dash.open("/settings/projects")
        page.wait_for_selector("main[data-loaded]")
        mine = page.locator(f"#projects-table tr[data-name='{owner.project_name}']")
        expect(mine).to_contain_text("this key's")
        page.fill("#project-name", name)
        page.click("#project-form button[type=submit]")
        secret = page.locator("#project-key-secret").inner_text()
        expect(page.locator(f"#projects-table tr[data-name='{name}']")).to_be_visible()
        dash.console.expect_status(409)
        page.fill("#project-name", name)
        page.click("#project-form button[type=submit]")
        expect(page.locator("#project-form .form-errors")).to_contain_text("Conflict (409)")
    with httpx.Client(base_url=live_api, headers={"Authorization": f"Bearer {secret}"}) as key:
        me = key.get("/v1/me").json()
    assert (me["project"]["name"], me["role"], me["org_admin"]) == (name, "admin", False)
    with new_dash(browser, live_api, owner.api_key) as dash:
        dash.open("/settings/projects")  # a project admin: the notice, and no tab for it
        dash.page.wait_for_selector("main[data-loaded]")
        expect(dash.page.locator("#admin-only")).to_contain_text("organisation admins only")
        expect(dash.page.locator("#settings-nav a[data-section='projects']")).to_have_count(0)
