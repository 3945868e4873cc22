// Submit: a YAML editor for a job spec (the built-in trainer's, or a script job's with
// `entrypoint`: a template of each to start from). While you type, the API checks the text
// (POST /v1/spec/validate, the same checks as POST /v1/jobs) and its 422 field paths are shown
// next to the lines they concern; GET /v1/spec/schema describes the field under the cursor.

import { ApiError, api, capabilities } from "./api.js";
import { describe, fieldSchema, pathAtLine } from "./schema.js";
import { h, showError, toYaml } from "./util.js";

const TEMPLATE = {
  name: "my-run",
  data: { dataset: "ds_..." },
  model: { n_layers: 2, n_heads: 2, d_model: 64, seq_len: 64 },
  train: { micro_batch_size: 8, max_steps: 50, log_interval_steps: 1 },
  eval: { interval_steps: 25, num_batches: 2 },
  resources: { procs_per_node: 1 },
};
// A script job: the team's own code from an uploaded archive (`torchyard code upload DIR`).
const SCRIPT_TEMPLATE = {
  name: "my-script",
  entrypoint: { code: "code_...", command: ["python", "train.py"] },
  resources: { procs_per_node: 1 },
};
const CHECK_DELAY_MS = 250;

/** The trainer template on one dataset (by name, as a user would write it): a preference
 * dataset trains with DPO, which scores whole answers (no packing). */
async function templateFor(datasetId) {
  const ds = await api(`/v1/datasets/${encodeURIComponent(datasetId)}`);
  const data = { dataset: ds.name, ...(ds.format === "preference" ? { packing: false } : {}) };
  const method = ds.format === "preference" ? { method: { kind: "dpo" } } : {};
  return { ...TEMPLATE, name: `${ds.name}-run`.slice(0, 100), data, ...method };
}

/** The trainer template with the project's newest dataset, or the script one with its newest
 * code archive (when the API lists archives). */
async function template(kind) {
  if (kind === "script") {
    if (!(await capabilities()).codeList) return SCRIPT_TEMPLATE;
    const { items } = await api("/v1/code");
    if (!items.length) return SCRIPT_TEMPLATE;
    return { ...SCRIPT_TEMPLATE, entrypoint: { ...SCRIPT_TEMPLATE.entrypoint, code: items[0].id } };
  }
  const sets = await api("/v1/datasets");
  return sets.items.length ? { ...TEMPLATE, data: { dataset: sets.items[0].id } } : TEMPLATE;
}

/** The 1-based line of the deepest part of `loc` in `lines` (JSON Pointer -> line), or null. */
export function lineOf(lines, loc) {
  let found = lines?.[""] ?? null;
  let pointer = "";
  for (const part of loc) {
    const next = `${pointer}/${String(part).replace(/~/g, "~0").replace(/\//g, "~1")}`;
    if (lines && next in lines) { pointer = next; found = lines[next]; }
  }
  return found;
}

/** A code editor: a textarea over a backdrop that marks lines and shows messages beside them. */
function codeEditor() {
  const textarea = h("textarea", {
    id: "spec-editor", class: "code-input", spellcheck: false, wrap: "off",
    autocapitalize: "off", autocomplete: "off", "aria-label": "job spec (YAML)",
  });
  const gutter = h("div", { class: "gutter", "aria-hidden": "true" });
  const backdrop = h("div", { class: "backdrop", "aria-hidden": "true" });
  let marks = new Map(); // line -> [message]

  function paint() {
    const lines = textarea.value.split("\n");
    gutter.replaceChildren(...lines.map((_, i) => h("div", {
      class: marks.has(i + 1) ? "bad" : "", dataset: { line: i + 1 },
    }, String(i + 1))));
    backdrop.replaceChildren(...lines.map((text, i) => {
      const messages = marks.get(i + 1);
      return h("div", { class: messages ? "bad" : "", dataset: { line: i + 1 } },
        h("span", { class: "ghost" }, text || " "),
        messages ? h("span", { class: "note" }, `  ◀ ${messages.join("; ")}`) : "");
    }));
    sync();
  }
  function sync() {
    backdrop.scrollTop = textarea.scrollTop;
    backdrop.scrollLeft = textarea.scrollLeft;
    gutter.scrollTop = textarea.scrollTop;
  }
  textarea.addEventListener("scroll", sync);
  textarea.addEventListener("input", paint);

  return {
    node: h("div", { class: "code" }, gutter, h("div", { class: "code-area" }, backdrop, textarea)),
    textarea,
    paint,
    /** Mark `problems` ([{line, msg}]) beside their lines. */
    mark(problems) {
      marks = new Map();
      for (const p of problems) {
        if (p.line) marks.set(p.line, [...(marks.get(p.line) ?? []), p.msg]);
      }
      paint();
    },
    /** Select line `n` (1-based) and scroll it into view. */
    selectLine(n) {
      const lines = textarea.value.split("\n");
      const start = lines.slice(0, n - 1).reduce((sum, l) => sum + l.length + 1, 0);
      textarea.focus();
      textarea.setSelectionRange(start, start + lines[n - 1].length);
      const lineHeight = textarea.scrollHeight / lines.length;
      textarea.scrollTop = Math.max(0, (n - 5) * lineHeight);
      sync();
    },
    /** The 0-based line the cursor is on. */
    cursorLine() {
      return textarea.value.slice(0, textarea.selectionStart).split("\n").length - 1;
    },
  };
}

export function submitPage(root, query) {
  const editor = codeEditor();
  const problems = h("ul", { class: "errors", id: "spec-errors" });
  const status = h("p", { class: "muted", id: "submit-status" });
  const help = h("p", { class: "muted help", id: "field-help" });
  const button = h("button", { class: "primary", type: "submit", id: "submit-job" }, "Submit");
  const kind = query.get("template") === "script" ? "script" : "trainer";
  const templateSel = h("select", {
    id: "spec-template", "aria-label": "template", hidden: Boolean(query.get("from")),
  }, h("option", { value: "trainer", selected: kind === "trainer" }, "Built-in trainer"),
  h("option", { value: "script", selected: kind === "script" }, "Your own code (entrypoint)"));
  templateSel.addEventListener("change", () => {
    template(templateSel.value).then(async (spec) => {
      editor.textarea.value = `${toYaml(spec).trimStart()}\n`;
      editor.paint();
      await check();
    }).catch(showError);
  });
  let schema = null;
  let typing = null;
  let checking = null; // the AbortController of the check in flight
  let lines = null; // JSON Pointer -> line, of the last text the API accepted

  function show(items, source) {
    problems.replaceChildren(...items.map((p) => h("li", { dataset: { loc: p.path.join(".") } },
      h("code", {}, p.path.join(".") || "(spec)"),
      p.line ? h("a", {
        href: "#", class: "line",
        onclick: (e) => { e.preventDefault(); editor.selectLine(p.line); showHelp(); },
      }, ` line ${p.line}`) : "",
      ` ${p.msg}`)));
    if (!items.length) problems.append(h("li", { class: "ok" }, "POST /v1/jobs would accept this spec."));
    problems.dataset.source = source;
    editor.mark(items);
  }

  function placed(err, lineMap) {
    return err.details.map((d) => {
      const path = d.loc[0] === "body" ? d.loc.slice(1) : d.loc;
      return { path, msg: d.msg, line: d.line ?? lineOf(lineMap, path) };
    });
  }

  /** Ask the API about the text; resolves to {spec, lines} or null (problems shown). */
  async function check() {
    checking?.abort();
    const controller = new AbortController();
    checking = controller;
    try {
      const answer = await api("/v1/spec/validate", {
        method: "POST", text: editor.textarea.value, contentType: "application/yaml",
        signal: controller.signal,
      });
      lines = answer.lines;
      show([], "validate");
      return answer;
    } catch (err) {
      if (controller.signal.aborted) return null;
      if (!(err instanceof ApiError) || !err.details.length) throw err;
      show(placed(err, null), "validate");
      return null;
    } finally {
      if (checking === controller) checking = null;
    }
  }

  function showHelp() {
    if (!schema) return;
    const path = pathAtLine(editor.textarea.value.split("\n"), editor.cursorLine());
    const field = path.length ? fieldSchema(schema, path) : null;
    help.replaceChildren(...(field
      ? [h("code", {}, path.join(".")), ` ${describe(field, schema)}`]
      : ["Put the cursor on a field to see what the schema says about it."]));
  }

  editor.textarea.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => check().catch(showError), CHECK_DELAY_MS);
    showHelp();
  });
  for (const type of ["click", "keyup"]) editor.textarea.addEventListener(type, showHelp);

  const form = h("form", { class: "editor", onsubmit: async (event) => {
    event.preventDefault();
    clearTimeout(typing);
    button.disabled = true;
    status.textContent = "Checking…";
    try {
      const checked = await check();
      if (!checked) {
        status.textContent = "422 validation_error: fix the fields listed below.";
        return;
      }
      status.textContent = "Submitting…";
      const job = await api("/v1/jobs", { method: "POST", body: checked.spec });
      window.location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      status.textContent = `${err.status} ${err.code ?? ""}: ${err.message}`;
      if (err.details.length) show(placed(err, lines), "jobs");
    } finally {
      button.disabled = false;
    }
  } },
  h("div", {}, editor.node, help),
  h("div", {},
    h("div", { class: "toolbar" }, button, templateSel,
      h("a", { href: "/docs", target: "_blank" }, "API docs")),
    status,
    h("h2", {}, "Problems"), problems,
    h("p", { class: "muted" }, "YAML (or JSON). Checked by the API as you type; the fields are "
      + "those of GET /v1/spec/schema."),
    h("p", { class: "muted", id: "script-hint" }, "Your own code: upload its directory first ",
      h("code", {}, "torchyard code upload DIR"), " and put the archive's id in ",
      h("code", {}, "entrypoint.code"), ".")));

  (async () => {
    const from = query.get("from");
    let spec;
    if (from) {
      const job = await api(`/v1/jobs/${from}`);
      spec = { ...job.spec, name: `${job.spec.name}-copy` };
    } else if (query.get("dataset")) {
      spec = await templateFor(query.get("dataset"));
    } else {
      spec = await template(kind);
    }
    if (!editor.textarea.value) editor.textarea.value = `${toYaml(spec).trimStart()}\n`;
    editor.paint();
    schema = await api("/v1/spec/schema");
    showHelp();
    await check();
    root.dataset.loaded = "true";
  })().catch(showError);

  root.append(h("h1", {}, title(query)), form);
  return () => { clearTimeout(typing); checking?.abort(); };
}

function title(query) {
  return query.get("from") ? `Clone job #${query.get("from")}` : "Submit a job";
}
