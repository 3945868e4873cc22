// Training sessions of the Tinker-compatible API: the project's sessions (#/sessions) and one
// session (#/sessions/ses_...): what its client sent (name, tags, metadata, SDK version), its
// heartbeats, its calls by state, and each training client with the session job serving it,
// whose page has the loss per optim_step, tokens and checkpoints like any job's.

import { api } from "./api.js";
import { fmtTime, h, poll, stateBadge } from "./util.js";

const REFRESH_MS = 3000;

/** "81 done · 1 waiting · 2 failed" from the calls by state. */
function callsText(calls) {
  const waiting = (calls.queued ?? 0) + (calls.running ?? 0);
  return [`${calls.done ?? 0} done`, waiting ? `${waiting} waiting` : null,
    calls.failed ? `${calls.failed} failed` : null].filter(Boolean).join(" · ");
}

/** The furthest training client's optimizer steps, or "–" before the first. */
function stepsText(session) {
  const steps = session.models.map((m) => m.current_step).filter((s) => s !== null);
  return steps.length ? String(Math.max(...steps)) : "–";
}

export function sessionsPage(root) {
  const body = h("tbody");
  const table = h("table", { id: "sessions-table" },
    h("thead", {}, h("tr", {}, ["session", "name", "state", "training clients", "steps", "calls",
      "last heartbeat", "created"].map((c) => h("th", {}, c)))), body);
  root.append(h("h1", {}, "Sessions"),
    h("p", { class: "muted" }, "Training sessions driven by the official tinker client "
      + "(TINKER_BASE_URL = this server + /tinker). Each training client is a session job."),
    h("div", { class: "table-wrap panel" }, table));
  return poll(async () => {
    const { items } = await api("/v1/sessions", { query: { limit: 200 } });
    body.replaceChildren(...(items.length ? items.map((s) => h("tr", { dataset: { session: s.id } },
      h("td", {}, h("a", { href: `#/sessions/${s.id}` }, s.id)),
      h("td", {}, s.display_name ?? "–"),
      h("td", {}, stateBadge(s.state, s.ended_reason)),
      h("td", {}, ...s.models.flatMap((m, i) => [i ? ", " : "",
        h("a", { href: `#/jobs/${m.job_id}` }, `#${m.job_id}`)]), s.models.length ? "" : "none"),
      h("td", { class: "num" }, stepsText(s)),
      h("td", {}, callsText(s.calls)),
      h("td", {}, fmtTime(s.last_heartbeat_at)),
      h("td", {}, fmtTime(s.created_at))))
      : [h("tr", {}, h("td", { colspan: 8, class: "muted" }, "no sessions yet"))]));
    root.dataset.loaded = "true";
  }, REFRESH_MS);
}

function modelsTable(session) {
  return h("table", { id: "session-models" },
    h("thead", {}, h("tr", {}, ["training client", "base model", "LoRA rank", "job", "state",
      "step"].map((c) => h("th", {}, c)))),
    h("tbody", {}, session.models.map((m) => h("tr", { dataset: { model: m.model_id } },
      h("td", {}, m.model_id),
      h("td", {}, m.base_model),
      h("td", { class: "num" }, String(m.lora_rank)),
      h("td", {}, h("a", { href: `#/jobs/${m.job_id}` }, `#${m.job_id}`)),
      h("td", {}, m.job_state ? stateBadge(m.job_state) : "–"),
      h("td", { class: "num" }, m.current_step === null ? "–" : String(m.current_step))))));
}

export function sessionPage(root, sessionId) {
  const title = h("h1", {}, `Session ${sessionId}`);
  const card = h("section", { class: "panel", id: "session-summary" });
  const models = h("section", { class: "panel", id: "session-clients" });
  root.append(title, card, models);
  return poll(async () => {
    const s = await api(`/v1/sessions/${encodeURIComponent(sessionId)}`);
    if (s.display_name) title.textContent = `Session ${s.display_name}`;
    const meta = Object.entries(s.user_metadata);
    card.replaceChildren(h("dl", { class: "kv" },
      h("dt", {}, "id"), h("dd", {}, s.id),
      h("dt", {}, "state"), h("dd", { id: "session-state" }, stateBadge(s.state)),
      ...(s.ended_at ? [h("dt", {}, "ended"), h("dd", { id: "session-ended" },
        `${fmtTime(s.ended_at)}: ${s.ended_reason ?? "–"}`)] : []),
      h("dt", {}, "created"), h("dd", {}, `${fmtTime(s.created_at)}${s.owner ? ` by ${s.owner}` : ""}`),
      h("dt", {}, "last heartbeat"), h("dd", {}, fmtTime(s.last_heartbeat_at)),
      h("dt", {}, "calls"), h("dd", { id: "session-calls" }, callsText(s.calls)),
      h("dt", {}, "client"), h("dd", {}, `tinker ${s.sdk_version}`
        + (s.tags.length ? ` · tags ${s.tags.join(", ")}` : "")),
      ...meta.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { dataset: { meta: k } }, String(v))])));
    models.replaceChildren(h("h2", {}, "Training clients"), s.models.length ? modelsTable(s)
      : h("p", { class: "muted" }, "None yet: the client has created no training client."));
    root.dataset.loaded = "true";
  }, REFRESH_MS);
}
