// Building blocks of the settings pages: errors shown next to the form they answer (422 field
// paths, 403, 409), a two-click confirm button, a secret shown once with a copy button, tables.

import { copyButton, h } from "./util.js";

/** True when `me` (GET /v1/me) may use the admin routes: role admin and the admin scope. */
export function isAdmin(me) {
  return me.role === "admin" && me.scopes.includes("admin");
}

/** Where a form shows the API's answer to it: the message, and each 422 detail by field path
 *  (`body.url: ...`), with the matching input (`name` = the path's last part) marked invalid. */
export function formErrors(form) {
  const box = h("div", { class: "form-errors", role: "alert", hidden: true });
  const clear = () => {
    box.hidden = true;
    box.replaceChildren();
    for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  };
  const show = (err) => {
    clear();
    const label = { 401: "Not signed in", 403: "Not allowed", 404: "Not found", 409: "Conflict",
      422: "Invalid input", 429: "Too many requests" }[err.status] ?? "Error";
    box.append(h("strong", {}, err.status ? `${label} (${err.status}): ` : ""), err.message);
    const details = (err.details ?? []).filter((d) => d.loc?.length);
    if (details.length) {
      box.append(h("ul", {}, details.map((d) => h("li", { dataset: { loc: d.loc.join(".") } },
        h("code", {}, d.loc.join(".")), ` ${d.msg}`))));
      for (const d of details) {
        const name = d.loc.findLast((part, i) => i > 0 && typeof part === "string");
        const input = name && form.querySelector(`[name="${CSS.escape(name)}"]`);
        if (input) input.setAttribute("aria-invalid", "true");
      }
    }
    box.hidden = false;
  };
  return { box, show, clear };
}

/** Run `action` for a form's submit: its errors go next to it, its button waits meanwhile. */
export function onSubmit(form, errors, action) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = form.querySelector("button[type=submit]");
    errors.clear();
    if (button) button.disabled = true;
    try {
      await action();
    } catch (err) {
      errors.show(err);
    } finally {
      if (button) button.disabled = false;
    }
  });
}

/** A button that asks once more before `action` (no window.confirm: a second click). */
export function confirmButton(label, action, attrs = {}) {
  let armed = false;
  const button = h("button", { type: "button", class: "danger", ...attrs, onclick: async () => {
    if (!armed) {
      armed = true;
      button.textContent = `Confirm ${label.toLowerCase()}`;
      setTimeout(() => { armed = false; button.textContent = label; }, 5000);
      return;
    }
    button.disabled = true;
    try { await action(); } finally { button.disabled = false; }
  } }, label);
  return button;
}

/** A secret shown once (a new key, a webhook's signing secret), with a copy button. */
export function secretOnce(id, title, secret, note) {
  const status = h("span", { class: "muted copy-status" });
  const code = h("code", { class: "secret", id }, secret);
  const copy = copyButton(secret, code, status);
  return h("div", { class: "secret-once", role: "status" },
    h("strong", {}, title), h("div", { class: "secret-line" }, code, copy, status),
    h("p", { class: "muted" }, note ?? "It is shown only now: store it somewhere safe."));
}

/** A table with a header row and `rows` (or a muted line when there is none). */
export function table(id, columns, rows, empty) {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.endsWith("#") ? "num" : "" },
    c.replace(/#$/, ""))));
  const body = rows.length ? rows
    : [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, empty))];
  return h("div", { class: "table-wrap" },
    h("table", { id, class: "settings-table" }, h("thead", {}, head), h("tbody", {}, body)));
}

/** The notice in place of a section the caller may not read. */
export function adminOnly(me, what, org = false) {
  return h("p", { class: "panel notice", id: "admin-only" },
    `${what} are visible to ${org ? "organisation" : "project"} admins only; your key's role is `,
    h("code", {}, me.role), " with scopes ", h("code", {}, me.scopes.join(", ") || "none"), ".");
}
