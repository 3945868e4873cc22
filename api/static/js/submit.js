// Submit: a JSON editor for a JobSpec, checked against /v1/spec/schema while typing and
// validated by the API on submit; the API's 422 field paths are listed with their lines.

import { ApiError, api } from "./api.js";
import { validate } from "./schema.js";
import { h, showError } from "./util.js";

const TEMPLATE = {
  name: "my-run",
  data: { dataset: "ds_..." },
  model: { n_layers: 2, n_heads: 2, d_model: 64, seq_len: 64 },
  train: { micro_batch_size: 8, max_steps: 50, log_interval_steps: 1 },
  eval: { interval_steps: 25, num_batches: 2 },
  resources: { procs_per_node: 1 },
};

/** The 1-based line in `text` (pretty JSON) where the field at `path` starts, or null. */
export function lineOf(text, path) {
  const lines = text.split("\n");
  let from = 0;
  let found = null;
  for (const part of path) {
    if (typeof part === "number") continue;
    const i = lines.findIndex((line, n) => n >= from && line.trimStart().startsWith(`"${part}"`));
    if (i < 0) break;
    found = i + 1;
    from = i + 1;
  }
  return found;
}

function localProblems(text, schema) {
  let spec;
  try {
    spec = JSON.parse(text);
  } catch (err) {
    return [{ path: [], msg: `not JSON: ${err.message}` }];
  }
  return schema ? validate(spec, schema) : [];
}

/** Select line `n` (1-based) of the textarea, so a listed error shows where it is. */
function selectLine(editor, n) {
  const lines = editor.value.split("\n");
  const start = lines.slice(0, n - 1).reduce((sum, l) => sum + l.length + 1, 0);
  editor.focus();
  editor.setSelectionRange(start, start + lines[n - 1].length);
  const lineHeight = editor.scrollHeight / lines.length;
  editor.scrollTop = Math.max(0, (n - 5) * lineHeight);
}

function problemItem(editor, path, msg) {
  const where = path.join(".");
  const line = lineOf(editor.value, path);
  return h("li", { dataset: { loc: where } },
    h("code", {}, where || "(spec)"),
    line ? h("a", { href: "#", class: "line", onclick: (e) => { e.preventDefault(); selectLine(editor, line); } },
      ` line ${line}`) : "",
    ` ${msg}`);
}

export function submitPage(root, query) {
  const editor = h("textarea", { id: "spec-editor", class: "spec", spellcheck: false, "aria-label": "job spec (JSON)" });
  const hints = h("ul", { class: "errors", id: "local-errors" });
  const errors = h("ul", { class: "errors", id: "spec-errors" });
  const status = h("p", { class: "muted", id: "submit-status" });
  const button = h("button", { class: "primary", type: "submit", id: "submit-job" }, "Submit");
  let schema = null;
  let typing = null;

  const check = () => {
    const problems = localProblems(editor.value, schema);
    hints.replaceChildren(...problems.map((p) => problemItem(editor, p.path, p.msg)));
    if (!problems.length) hints.append(h("li", { class: "ok" }, "Matches the schema."));
  };
  editor.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(check, 200); });

  const form = h("form", { class: "editor", onsubmit: async (event) => {
    event.preventDefault();
    errors.replaceChildren();
    let spec;
    try {
      spec = JSON.parse(editor.value);
    } catch (err) {
      errors.append(problemItem(editor, [], `not JSON: ${err.message}`));
      return;
    }
    button.disabled = true;
    status.textContent = "Submitting…";
    try {
      const job = await api("/v1/jobs", { method: "POST", body: spec });
      window.location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      status.textContent = `${err.status} ${err.code ?? ""}: ${err.message}`;
      for (const d of err.details) {
        const path = d.loc[0] === "body" ? d.loc.slice(1) : d.loc;
        errors.append(problemItem(editor, path, d.msg));
      }
    } finally {
      button.disabled = false;
    }
  } },
  h("div", {}, editor),
  h("div", {},
    h("div", { class: "toolbar" }, button, h("a", { href: "/docs", target: "_blank" }, "API docs")),
    status,
    h("h2", {}, "Errors from the API"), errors,
    h("h2", {}, "While you type"), hints,
    h("p", { class: "muted" }, "JSON; the fields are those of GET /v1/spec/schema.")));

  (async () => {
    const from = query.get("from");
    let spec = TEMPLATE;
    if (from) {
      const job = await api(`/v1/jobs/${from}`);
      spec = { ...job.spec, name: `${job.spec.name}-copy` };
    } else {
      const sets = await api("/v1/datasets");
      if (sets.items.length) spec = { ...TEMPLATE, data: { dataset: sets.items[0].id } };
    }
    if (!editor.value) editor.value = JSON.stringify(spec, null, 2);
    schema = await api("/v1/spec/schema");
    check();
    root.dataset.loaded = "true";
  })().catch(showError);

  root.append(h("h1", {}, from(query)), form);
  return () => clearTimeout(typing);
}

function from(query) {
  return query.get("from") ? `Clone job #${query.get("from")}` : "Submit a job";
}
