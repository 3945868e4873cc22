// Settings: the project's members, service accounts, API keys, webhooks and quotas, all through
// the public REST API (#/settings/<section>). What the caller may change follows `GET /v1/me`:
// members, keys and webhooks are for project admins (role `admin` with the `admin` scope);
// everyone else sees what they may read, and the API's 403 still shows if it happens.

import { api } from "./api.js";
import { h, showError } from "./util.js";
import { adminOnly, isAdmin } from "./settings_common.js";
import { keysSection, membersSection, serviceAccountsSection } from "./settings_access.js";
import { webhooksSection } from "./settings_webhooks.js";
import { quotasSection } from "./settings_quotas.js";
import { projectsSection } from "./settings_projects.js";

const SECTIONS = [
  { id: "members", title: "Members", admin: true, render: membersSection },
  { id: "service-accounts", title: "Service accounts", admin: true,
    render: serviceAccountsSection },
  { id: "keys", title: "API keys", admin: true, render: keysSection },
  { id: "webhooks", title: "Webhooks", admin: true, render: webhooksSection },
  { id: "quotas", title: "Quotas", admin: false, render: quotasSection },
  // organisation admins only; the tab is not shown to anyone else
  { id: "projects", title: "Projects", orgAdmin: true, render: projectsSection },
];

export function settingsPage(root, sectionId) {
  let stopped = false;
  const body = h("div", { id: "settings-body" });
  const tabs = h("nav", { class: "subnav", id: "settings-nav" });
  root.append(h("h1", {}, "Settings"), tabs, body);
  api("/v1/me").then(async (me) => {
    if (stopped) return;
    const admin = isAdmin(me);
    const section = SECTIONS.find((s) => s.id === sectionId)
      ?? (admin ? SECTIONS[0] : SECTIONS.find((s) => s.id === "quotas"));
    for (const s of SECTIONS.filter((x) => !x.orgAdmin || me.org_admin)) {
      const locked = s.admin && !admin ? h("span", { class: "label" }, "admins") : "";
      tabs.append(h("a", { href: `#/settings/${s.id}`, dataset: { section: s.id },
        class: s === section ? "active" : "" }, s.title, locked));
    }
    tabs.append(h("a", { href: "#/usage", dataset: { section: "usage" } }, "Usage ↗"));
    root.dataset.role = me.role;
    root.dataset.section = section.id;
    if ((section.admin && !admin) || (section.orgAdmin && !me.org_admin)) {
      body.append(adminOnly(me, section.title, section.orgAdmin));
    } else {
      try {
        await section.render(body, { me, admin });
      } catch (err) { // e.g. a 403: the role changed since sign-in
        body.append(h("p", { class: "panel form-errors", role: "alert", id: "settings-error" },
          h("strong", {}, `HTTP ${err.status ?? "error"}: `), err.message));
      }
    }
    if (!stopped) root.dataset.loaded = "true";
  }).catch(showError);
  return () => { stopped = true; };
}
