// Settings: the project's webhooks (project admins): subscribe with event types (the signing
// secret is shown once), rotate and delete secrets, ping, enable/disable, delete, and each
// webhook's delivery log (status codes, response times, attempts) with redeliver.

import { api } from "./api.js";
import { fmtTime, h } from "./util.js";
import { confirmButton, formErrors, onSubmit, secretOnce, table } from "./settings_common.js";

const EVENT_CHOICES = [
  ["*", "everything"], ["job.*", "every job state change"], ["job.succeeded", ""],
  ["job.failed", ""], ["job.preempted", ""], ["checkpoint.saved", ""], ["export.ready", ""],
  ["alert.*", "metric alerts"],
];

// Metric alert rules (AlertRules): a number left empty is that rule off.
const ALERTS = [
  ["loss_spike_factor", "loss above k x its moving average, k =", "any", 1],
  ["eval_regression_margin", "eval loss worse than its best by", "any", 0],
  ["stalled_minutes", "no step progress for (min)", "any", 0],
  ["queued_minutes", "queued longer than (min)", "any", 0],
];

function alertFields() {
  return h("details", { class: "alerts", id: "webhook-alerts" },
    h("summary", {}, "Metric alerts (sent as alert.* events)"),
    h("label", {}, h("input", { type: "checkbox", name: "nan_loss", id: "alert-nan-loss" }),
      " NaN/Inf loss"),
    ALERTS.map(([name, text, step, min]) => h("label", {}, `${text} `, h("input", { name,
      id: `alert-${name.replaceAll("_", "-")}`, type: "number", step, min,
      placeholder: "off" }))));
}

function alertRules(form) {
  const rules = { nan_loss: form.elements.nan_loss.checked };
  for (const [name] of ALERTS) {
    if (form.elements[name].value !== "") rules[name] = Number(form.elements[name].value);
  }
  return rules;
}

function alertsText(rules) {
  const on = [];
  if (rules.nan_loss) on.push("NaN loss");
  if (rules.loss_spike_factor) on.push(`spike ${rules.loss_spike_factor}x`);
  if (rules.eval_regression_margin !== null) on.push(`eval +${rules.eval_regression_margin}`);
  if (rules.stalled_minutes) on.push(`stalled ${rules.stalled_minutes} min`);
  if (rules.queued_minutes) on.push(`queued ${rules.queued_minutes} min`);
  return on.length ? h("div", { class: "muted alert-rules" }, `alerts: ${on.join(", ")}`) : "";
}

function webhookForm() {
  return h("form", { class: "panel webhook-form", id: "webhook-form" },
    h("label", { class: "wide" }, "URL ", h("input", { name: "url", id: "webhook-url",
      required: true, type: "text", placeholder: "https://ci.example.com/hooks/torchyard",
      size: 48 })),
    h("label", {}, "Note ", h("input", { name: "description", id: "webhook-description",
      placeholder: "CI notifications", size: 24 })),
    h("fieldset", { class: "checks", id: "webhook-events" }, h("legend", {}, "Event types"),
      EVENT_CHOICES.map(([type, text]) => h("label", { title: text },
        h("input", { type: "checkbox", name: "event_types", value: type,
          checked: type === "job.*" ? "checked" : null }), " ", h("code", {}, type))),
      h("label", {}, "other ", h("input", { name: "more_types", id: "webhook-more-types",
        placeholder: "alert.stalled, ...", size: 18 }))),
    alertFields(),
    h("button", { type: "submit", class: "primary" }, "Subscribe"));
}

function webhookBody(form) {
  const ticked = [...form.querySelectorAll("input[name=event_types]:checked")].map((c) => c.value);
  const more = form.elements.more_types.value.split(",").map((t) => t.trim()).filter(Boolean);
  return { url: form.elements.url.value.trim(), event_types: [...ticked, ...more],
    description: form.elements.description.value.trim(), alert_rules: alertRules(form) };
}

function deliveryStatus(d) {
  const cls = { delivered: "ok", dead: "bad", pending: "warn" }[d.status];
  return h("span", { class: `badge ${cls}` }, d.status);
}

function attemptsLog(d) {
  if (!d.log.length) return h("span", { class: "muted" }, "not tried yet");
  return h("details", {}, h("summary", {}, `${d.log.length} tries`),
    h("ol", { class: "attempts" }, d.log.map((a) => h("li", {},
      `${fmtTime(a.at)} · ${a.status_code ?? "no answer"} · `
      + `${a.response_ms === null ? "–" : `${Math.round(a.response_ms)} ms`}`,
      a.error ? h("span", { class: "muted" }, ` · ${a.error}`) : ""))));
}

async function deliveriesPanel(hook, act) {
  const { items } = await api(`/v1/webhooks/${hook.id}/deliveries`);
  const rows = items.map((d) => h("tr", { dataset: { deliveryId: String(d.id),
    eventType: d.event_type, status: d.status } },
  h("td", { class: "num" }, String(d.id)),
  h("td", {}, h("code", {}, d.event_type)),
  h("td", {}, deliveryStatus(d)),
  h("td", { class: "num" }, d.last_status_code === null ? "–" : String(d.last_status_code)),
  h("td", { class: "num" }, d.last_response_ms === null ? "–"
    : `${Math.round(d.last_response_ms)} ms`),
  h("td", { class: "num" }, String(d.attempts)),
  h("td", {}, fmtTime(d.created_at)),
  h("td", {}, d.status === "pending" ? `next ${fmtTime(d.next_attempt_at)}`
    : fmtTime(d.delivered_at)),
  h("td", {}, attemptsLog(d)),
  h("td", { class: "actions" }, h("button", { type: "button", class: "redeliver",
    onclick: () => act(() => api(`/v1/webhooks/${hook.id}/deliveries/${d.id}/redeliver`,
      { method: "POST" })) }, "Redeliver"))));
  return h("div", { class: "deliveries", id: `deliveries-${hook.id}` },
    h("h3", {}, "Deliveries ", h("span", { class: "muted" }, "(latest 100, newest first)")),
    table(`deliveries-table-${hook.id}`, ["#", "Event", "Status", "HTTP#", "Response#",
      "Attempts#", "Happened", "Delivered / next", "Log", ""], rows, "No deliveries yet."));
}

function secretsCell(hook, act) {
  const removable = hook.secrets.length > 1; // the API keeps the last one (409)
  return h("td", { class: "secrets" }, hook.secrets.map((s) => h("span", { class: "label",
    title: `added ${fmtTime(s.created_at)}`, dataset: { secretId: s.id } }, s.id,
  removable ? h("button", { type: "button", class: "link", "aria-label": `delete secret ${s.id}`,
    onclick: () => act(() => api(`/v1/webhooks/${hook.id}/secrets/${s.id}`,
      { method: "DELETE" })) }, "×") : "")));
}

export async function webhooksSection(root) {
  const form = webhookForm();
  const errors = formErrors(form);
  form.append(errors.box);
  const listErrors = formErrors(root);
  const shown = h("div", { id: "webhook-secret" });
  const wrap = h("div", {});
  const open = new Set(); // webhooks whose deliveries are shown
  const load = async () => {
    const { items } = await api("/v1/webhooks");
    const rows = [];
    for (const hook of items) {
      rows.push(webhookRow(hook));
      if (open.has(hook.id)) {
        rows.push(h("tr", { class: "sub" }, h("td", { colspan: 6 },
          await deliveriesPanel(hook, act))));
      }
    }
    wrap.replaceChildren(table("webhooks-table", ["URL", "Event types", "Secrets", "Created",
      "Status", ""], rows, "No webhooks yet."));
  };
  const act = async (action) => {
    listErrors.clear();
    try {
      await action();
      await load();
    } catch (err) {
      listErrors.show(err);
      await load().catch(() => {}); // show what holds now
    }
  };
  const webhookRow = (hook) => h("tr", { dataset: { webhookId: hook.id, url: hook.url } },
    h("td", { class: "url" }, hook.url, hook.description
      ? h("div", { class: "muted" }, hook.description) : ""),
    h("td", { class: "events" }, hook.event_types.map((t) => h("code", { class: "label" }, t)),
      alertsText(hook.alert_rules)),
    secretsCell(hook, act),
    h("td", {}, fmtTime(hook.created_at)),
    h("td", {}, hook.disabled_at ? h("span", { class: "badge warn" }, "disabled")
      : h("span", { class: "badge ok" }, "enabled")),
    h("td", { class: "actions" },
      h("button", { type: "button", class: "ping", onclick: () => act(async () => {
        await api(`/v1/webhooks/${hook.id}/ping`, { method: "POST" });
        open.add(hook.id);
      }) }, "Ping"),
      h("button", { type: "button", class: "toggle-deliveries", onclick: () => act(async () => {
        if (!open.delete(hook.id)) open.add(hook.id);
      }) }, open.has(hook.id) ? "Hide deliveries" : "Deliveries"),
      h("button", { type: "button", class: "rotate", onclick: () => act(async () => {
        const secret = await api(`/v1/webhooks/${hook.id}/secrets`, { method: "POST" });
        shown.replaceChildren(secretOnce("webhook-secret-value",
          `New signing secret of ${hook.url}:`, secret.secret, "Shown only now. Deliveries "
          + "carry a signature by every secret until you delete the old one (× beside it)."));
      }) }, "Rotate secret"),
      h("button", { type: "button", class: "enable", onclick: () => act(() =>
        api(`/v1/webhooks/${hook.id}`, { method: "PATCH",
          body: { disabled: !hook.disabled_at } })) }, hook.disabled_at ? "Enable" : "Disable"),
      confirmButton("Delete", () => act(() => api(`/v1/webhooks/${hook.id}`,
        { method: "DELETE" })))));
  onSubmit(form, errors, async () => {
    const hook = await api("/v1/webhooks", { method: "POST", body: webhookBody(form) });
    shown.replaceChildren(secretOnce("webhook-secret-value", `Signing secret of ${hook.url}:`,
      hook.secret.secret, "Shown only now: the receiver verifies deliveries with it "
      + "(Standard Webhooks)."));
    form.reset();
    await load();
  });
  root.append(h("h2", {}, "Webhooks"), form, shown, listErrors.box, wrap,
    h("p", { class: "muted" }, "Deliveries are signed (Standard Webhooks) and retried with "
      + "backoff for hours; a ping queues a ping event to one webhook."));
  await load();
}
