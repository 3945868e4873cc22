// Settings sections for access (project admins): members and their roles, service accounts,
// and API keys with scopes, owner and expiry (the secret is shown once). /v1/members,
// /v1/service-accounts and /v1/keys.

import { api } from "./api.js";
import { fmtTime, h } from "./util.js";
import { confirmButton, formErrors, onSubmit, secretOnce, table } from "./settings_common.js";

const ROLES = ["viewer", "member", "admin"];
const SCOPES = ["jobs:read", "jobs:write", "datasets:write", "admin"];
const EXPIRY = [["", "never"], [86400, "1 day"], [7 * 86400, "7 days"],
  [30 * 86400, "30 days"], [90 * 86400, "90 days"], [365 * 86400, "1 year"]];

function roleSelect(name, selected, attrs = {}) {
  return h("select", { name, ...attrs },
    // an attribute, not the property: form.reset() goes back to it
    ROLES.map((r) => h("option", { value: r, selected: r === selected ? "selected" : null }, r)));
}

/** A section: a form, a box for errors of row actions, the list, and `load` to refresh it. */
function section(root, { title, form, list }) {
  const listErrors = formErrors(root);
  const done = h("p", { class: "done", role: "status" });
  const wrap = h("div", {});
  root.append(h("h2", {}, title), form ?? "", listErrors.box, done, wrap);
  const load = async () => {
    wrap.replaceChildren(await list());
  };
  /** A row action: its error shows above the list, else `message`; the list reloads after. */
  const act = async (action, message) => {
    listErrors.clear();
    done.textContent = "";
    try {
      await action();
      done.textContent = message ?? "";
      await load();
    } catch (err) {
      listErrors.show(err);
      await load().catch(() => {}); // show what holds now (a refused role change reverts)
    }
  };
  return { load, act, listErrors };
}

export async function membersSection(root) {
  const subject = h("input", { name: "subject", id: "member-subject", required: true,
    placeholder: "ada@example.com or an OIDC subject", size: 34 });
  const form = h("form", { class: "panel inline-form", id: "member-form" },
    h("label", {}, "Subject ", subject),
    h("label", {}, "Role ", roleSelect("role", "member", { id: "member-role" })),
    h("button", { type: "submit", class: "primary" }, "Add member"));
  const errors = formErrors(form);
  form.append(errors.box);
  const s = section(root, { title: "Members", form, list: async () => {
    const { items } = await api("/v1/members");
    return table("members-table", ["Subject", "Role", "Added", ""], items.map((m) =>
      h("tr", { dataset: { subject: m.subject, memberId: m.id } },
        h("td", {}, m.subject),
        h("td", {}, roleSelect("member-role", m.role, { "aria-label": `role of ${m.subject}`,
          onchange: (e) => s.act(() => api(`/v1/members/${m.id}`,
            { method: "PATCH", body: { role: e.target.value } }),
          `${m.subject} is now ${e.target.value === "admin" ? "an" : "a"} ${e.target.value}.`) })),
        h("td", {}, fmtTime(m.created_at)),
        h("td", { class: "actions" }, confirmButton("Remove", () => s.act(() =>
          api(`/v1/members/${m.id}`, { method: "DELETE" }), `${m.subject} was removed.`)))),
    ), "No members yet.");
  } });
  onSubmit(form, errors, async () => {
    await api("/v1/members", { method: "POST", body: { subject: subject.value.trim(),
      role: form.elements.role.value } });
    form.reset();
    await s.load();
  });
  root.append(h("p", { class: "muted" }, "Removing a member revokes their keys; a new role "
    + "holds for their keys from the next request on."));
  await s.load();
}

export async function serviceAccountsSection(root) {
  const name = h("input", { name: "name", id: "sa-name", required: true, placeholder: "ci" });
  const form = h("form", { class: "panel inline-form", id: "sa-form" },
    h("label", {}, "Name ", name),
    h("label", {}, "Role ", roleSelect("role", "member", { id: "sa-role" })),
    h("button", { type: "submit", class: "primary" }, "Create service account"));
  const errors = formErrors(form);
  form.append(errors.box);
  const s = section(root, { title: "Service accounts", form, list: async () => {
    const { items } = await api("/v1/service-accounts");
    return table("sa-table", ["Name", "Role", "Created", "Status", ""], items.map((a) =>
      h("tr", { dataset: { name: a.name, accountId: a.id } },
        h("td", {}, a.name), h("td", {}, a.role), h("td", {}, fmtTime(a.created_at)),
        h("td", {}, a.disabled_at ? `disabled ${fmtTime(a.disabled_at)}` : "active"),
        h("td", { class: "actions" }, a.disabled_at ? "" : confirmButton("Disable", () =>
          s.act(() => api(`/v1/service-accounts/${a.id}`, { method: "DELETE" })))))),
    "No service accounts yet.");
  } });
  onSubmit(form, errors, async () => {
    await api("/v1/service-accounts", { method: "POST",
      body: { name: name.value.trim(), role: form.elements.role.value } });
    form.reset();
    await s.load();
  });
  root.append(h("p", { class: "muted" }, "Give a service account keys under API keys. "
    + "Disabling it makes all its keys answer 401."));
  await s.load();
}

function keyStatus(key) {
  if (key.revoked_at) return h("span", { class: "badge bad" }, "revoked");
  if (key.expires_at && Date.parse(key.expires_at) <= Date.now()) {
    return h("span", { class: "badge warn" }, "expired");
  }
  return h("span", { class: "badge ok" }, "active");
}

/** A row of the keys table; `mine`: the key this browser signed in with (`GET /v1/me`). */
function keyRow(key, act, mine) {
  const owner = key.owner ? `${key.owner.kind === "member" ? "member" : "service account"} `
    + key.owner.name : "–";
  return h("tr", { class: mine ? "mine" : "", dataset: { keyId: key.id, name: key.name } },
    h("td", {}, key.name, key.org_admin ? h("span", { class: "label" }, "org admin") : "",
      mine ? h("span", { class: "badge info this-browser", title: "the key this browser signed "
        + "in with: revoking it signs this browser out" }, "this browser's key") : ""),
    h("td", {}, h("code", {}, `${key.prefix}…`)),
    h("td", { class: "scopes" }, key.scopes.join(", ")),
    h("td", {}, key.role ?? "–"),
    h("td", { class: "owner" }, owner),
    h("td", {}, key.expires_at ? fmtTime(key.expires_at) : "never"),
    h("td", {}, fmtTime(key.last_used_at)),
    h("td", { class: "status" }, keyStatus(key)),
    h("td", { class: "actions" }, key.revoked_at ? "" : confirmButton("Revoke", () =>
      act(() => api(`/v1/keys/${key.id}`, { method: "DELETE" })))));
}

function keyForm(members, accounts) {
  const owner = h("select", { name: "owner", id: "key-owner" },
    h("option", { value: "" }, "no owner (own role)"),
    members.map((m) => h("option", { value: `member:${m.id}` }, `member ${m.subject}`)),
    accounts.filter((a) => !a.disabled_at)
      .map((a) => h("option", { value: `sa:${a.id}` }, `service account ${a.name}`)));
  const role = roleSelect("role", "member", { id: "key-role" });
  owner.addEventListener("change", () => { role.disabled = Boolean(owner.value); });
  return h("form", { class: "panel key-form", id: "key-form" },
    h("label", {}, "Name ", h("input", { name: "name", id: "key-name", required: true,
      placeholder: "ci" })),
    h("fieldset", { class: "checks", id: "key-scopes" }, h("legend", {}, "Scopes"),
      SCOPES.map((scope) => h("label", {}, h("input", { type: "checkbox", name: "scopes",
        value: scope }), ` ${scope}`))),
    h("label", {}, "Owner ", owner),
    h("label", {}, "Role ", role),
    h("label", {}, "Expires ", h("select", { name: "expires_in", id: "key-expiry" },
      EXPIRY.map(([v, text]) => h("option", { value: v }, text)))),
    h("button", { type: "submit", class: "primary" }, "Create key"));
}

/** The POST /v1/keys body of the key form: no scope ticked means all its owner's role holds. */
function keyBody(form) {
  const body = { name: form.elements.name.value.trim() };
  const scopes = [...form.querySelectorAll("input[name=scopes]:checked")].map((c) => c.value);
  if (scopes.length) body.scopes = scopes;
  const [kind, id] = form.elements.owner.value.split(":");
  if (kind === "member") body.member_id = id;
  else if (kind === "sa") body.service_account_id = id;
  else body.role = form.elements.role.value;
  if (form.elements.expires_in.value) body.expires_in = Number(form.elements.expires_in.value);
  return body;
}

export async function keysSection(root, { me }) {
  const [members, accounts] = await Promise.all([
    api("/v1/members"), api("/v1/service-accounts")]);
  const form = keyForm(members.items, accounts.items);
  const errors = formErrors(form);
  const created = h("div", { id: "key-created" });
  form.append(errors.box);
  const s = section(root, { title: "API keys", form, list: async () => {
    const { items } = await api("/v1/keys");
    return table("keys-table", ["Name", "Prefix", "Scopes", "Role", "Owner", "Expires",
      "Last used", "Status", ""], items.map((key) => keyRow(key, s.act, key.id === me.key.id)),
      "No keys.");
  } });
  form.after(created);
  onSubmit(form, errors, async () => {
    const key = await api("/v1/keys", { method: "POST", body: keyBody(form) });
    created.replaceChildren(secretOnce("key-secret", `Key “${key.name}” created:`, key.secret,
      "Shown only now: store it safely; a lost key is revoked and replaced, never shown again."));
    form.reset();
    form.elements.role.disabled = false;
    await s.load();
  });
  root.append(h("p", { class: "muted" }, "No scope ticked: the key holds every scope of its "
    + "owner's role. A revoked key answers 401 from the next request on."));
  await s.load();
}
