// Settings for organisation admins (`GET /v1/me`: `org_admin`): the organisation's projects,
// and a new project with its first admin key, whose secret is shown once (/v1/projects).

import { api } from "./api.js";
import { fmtTime, h } from "./util.js";
import { formErrors, onSubmit, secretOnce, table } from "./settings_common.js";

export async function projectsSection(root, { me }) {
  const name = h("input", { name: "name", id: "project-name", required: true,
    placeholder: "nlp" });
  const form = h("form", { class: "panel inline-form", id: "project-form" },
    h("label", {}, "Name ", name),
    h("button", { type: "submit", class: "primary" }, "Create project"));
  const errors = formErrors(form);
  form.append(errors.box);
  const created = h("div", { id: "project-created" });
  const wrap = h("div", {});
  const load = async () => {
    const { items } = await api("/v1/projects");
    wrap.replaceChildren(table("projects-table", ["Name", "Id", "Created"], items.map((p) =>
      h("tr", { dataset: { name: p.name, projectId: p.id } },
        h("td", {}, p.name, p.id === me.project.id ? h("span", { class: "label" }, "this key's")
          : ""),
        h("td", {}, h("code", {}, p.id)), h("td", {}, fmtTime(p.created_at)))),
    "No projects."));
  };
  onSubmit(form, errors, async () => {
    const answer = await api("/v1/projects", { method: "POST", body: { name: name.value.trim() } });
    created.replaceChildren(secretOnce("project-key-secret",
      `Project “${answer.project.name}” created; its first admin key:`, answer.key.secret,
      "Shown only now: hand it to the project's admin, who signs in with it to add members "
      + "and keys."));
    form.reset();
    await load();
  });
  root.append(h("h2", {}, "Projects"), form, created, wrap,
    h("p", { class: "muted" }, "Organisation admins create projects; each project's admins "
      + "manage its members, keys, webhooks and quotas."));
  await load();
}
