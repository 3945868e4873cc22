// Settings: the project's quotas per pool with what it uses against them now (GET /v1/quotas,
// every reader), and a form that sets one pool's quota (PUT /v1/quotas/{pool}, admins).

import { api } from "./api.js";
import { fmtTime, h } from "./util.js";
import { formErrors, onSubmit, table } from "./settings_common.js";

const LIMITS = [
  ["max_slots", "Max GPUs (slots)", "1"],
  ["max_running_jobs", "Max running jobs", "1"],
  ["max_queued_jobs", "Max queued jobs", "1"],
  ["monthly_slot_hours", "GPU-hours / month", "any"],
];

/** "used / limit" (limit "∞" when none), marked `full` when the use reached the limit. */
function usage(used, limit, digits = 0) {
  const text = `${Number(used).toFixed(digits)} / ${limit ?? "∞"}`;
  const full = limit !== null && limit !== undefined && used >= limit;
  return h("td", { class: `num${full ? " full" : ""}` }, text);
}

function quotaRow(q, edit) {
  return h("tr", { dataset: { pool: q.pool } },
    h("td", {}, q.pool === "*" ? h("span", {}, "* ", h("span", { class: "muted" }, "(all pools)"))
      : q.pool),
    usage(q.slots_in_use, q.max_slots),
    usage(q.running_jobs, q.max_running_jobs),
    usage(q.queued_jobs, q.max_queued_jobs),
    usage(q.slot_hours_this_month, q.monthly_slot_hours, 1),
    h("td", { class: "num" }, String(q.weight)),
    h("td", {}, fmtTime(q.updated_at)),
    edit ? h("td", { class: "actions" }, h("button", { type: "button", class: "edit",
      onclick: () => edit(q) }, "Edit")) : "");
}

function quotaForm() {
  return h("form", { class: "panel quota-form", id: "quota-form" },
    h("label", {}, "Pool ", h("input", { name: "pool", id: "quota-pool", required: true,
      placeholder: "default, or * for all", size: 16 })),
    LIMITS.map(([name, text, step]) => h("label", {}, `${text} `, h("input", { name,
      id: `quota-${name.replaceAll("_", "-")}`, type: "number", min: 0, step,
      placeholder: "no limit" }))),
    h("label", {}, "Weight ", h("input", { name: "weight", id: "quota-weight", type: "number",
      min: 0, step: "any", value: "1" })),
    h("button", { type: "submit", class: "primary" }, "Set quota"));
}

function quotaBody(form) {
  const body = { weight: Number(form.elements.weight.value || 1) };
  for (const [name] of LIMITS) {
    const value = form.elements[name].value;
    if (value !== "") body[name] = Number(value);
  }
  return body;
}

export async function quotasSection(root, { admin }) {
  const wrap = h("div", {});
  const form = admin ? quotaForm() : null;
  const errors = form ? formErrors(form) : null;
  const edit = form ? (q) => {
    errors.clear();
    form.elements.pool.value = q.pool;
    for (const [name] of LIMITS) form.elements[name].value = q[name] ?? "";
    form.elements.weight.value = q.weight;
    form.elements.max_slots.focus();
  } : null;
  const load = async () => {
    const { items } = await api("/v1/quotas");
    wrap.replaceChildren(table("quotas-table", ["Pool", "GPUs in use#", "Running#", "Queued#",
      "GPU-hours this month#", "Weight#", "Updated", ...(admin ? [""] : [])],
    items.map((q) => quotaRow(q, edit)), "No quotas: every pool is unlimited, weight 1."));
  };
  root.append(h("h2", {}, "Quotas"), wrap);
  if (form) {
    form.append(errors.box);
    onSubmit(form, errors, async () => {
      const pool = form.elements.pool.value.trim();
      await api(`/v1/quotas/${encodeURIComponent(pool)}`, { method: "PUT",
        body: quotaBody(form) });
      form.reset();
      await load();
    });
    root.append(h("h2", {}, "Set a pool's quota"), form,
      h("p", { class: "muted" }, "Setting a quota replaces the pool's quota: a limit left empty is "
        + "no limit. Jobs over a limit wait queued with the reason; a submission past the "
        + "queued limit is refused with 429."));
  } else {
    root.append(h("p", { class: "muted", id: "quotas-read-only" },
      "Read-only: project admins set quotas."));
  }
  await load();
}
