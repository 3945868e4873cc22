// Datasets: the project's list, and one dataset's page: its stats, files, a sample of its
// records, the jobs that used it, "Use in a new job", and the mask preview
// (POST /v1/datasets/{id}/preview): tokens coloured by mask bit, so a user sees what a job
// would learn from before it runs.

import { api } from "./api.js";
import { copyButton, fmtBytes, fmtNumber, fmtTime, h, showError, stateBadge } from "./util.js";

const PREVIEWABLE = new Set(["messages", "prompt_completion", "jsonl_text"]);
const FILES_SHOWN = 100;
const RECORDS_SHOWN = 3;
const JOBS_SHOWN = 20;

export function datasetsPage(root) {
  let stopped = false; // an answer that comes after the user left is not shown
  const body = h("tbody", { id: "datasets-body" });
  root.append(
    h("h1", {}, "Datasets"),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Name", "Id", "Format", "Records", "Size", "Created"].map(
        (c) => h("th", { class: c === "Records" || c === "Size" ? "num" : "" }, c)))),
      body)));
  api("/v1/datasets").then(({ items }) => {
    if (stopped) return;
    if (!items.length) {
      body.append(h("tr", {}, h("td", { colspan: 6, class: "muted" },
        "No datasets yet: upload one with `torchyard datasets upload NAME FILE`.")));
    }
    for (const ds of items) {
      body.append(h("tr", { dataset: { datasetId: ds.id } },
        h("td", {}, h("a", { href: `#/datasets/${ds.id}`, class: "dataset-name" }, ds.name)),
        idCell(ds.id),
        h("td", {}, ds.format),
        h("td", { class: "num" }, fmtNumber(ds.stats?.records)),
        h("td", { class: "num" }, fmtBytes(ds.size_bytes)),
        h("td", {}, fmtTime(ds.created_at))));
    }
    root.dataset.loaded = "true";
  }).catch(showError);
  return () => { stopped = true; };
}

/** A dataset's id, which a spec's `data.dataset` takes (its name does too), with Copy. */
function idCell(id) {
  const code = h("code", { class: "dataset-id" }, id);
  return h("td", { class: "nowrap" }, code, " ", copyButton(id, code));
}

function percentiles(l) {
  return `p50 ${l.p50} · p90 ${l.p90} · p99 ${l.p99} · max ${l.max}`;
}

function statsList(ds) {
  const s = ds.stats ?? {};
  const rows = [
    ["Format", ds.format], ["Records", fmtNumber(s.records)], ["Size", fmtBytes(ds.size_bytes)],
    ["Files", ds.num_files], ["Duplicates", fmtNumber(s.duplicates)],
    ...(ds.include ? [["Include", ds.include.join(", ")]] : []),
    ...(ds.exclude?.length ? [["Exclude", ds.exclude.join(", ")]] : []),
    ["Created", fmtTime(ds.created_at)],
  ];
  if (s.roles && Object.keys(s.roles).length) {
    rows.push(["Messages", Object.entries(s.roles).sort().map(([r, n]) => `${r} ${n}`).join(", ")]);
  }
  for (const [part, lengths] of Object.entries(s.chars ?? {})) {
    rows.push([`Chars (${part})`, percentiles(lengths)]);
  }
  if (s.tokens) rows.push(["Tokens per record", percentiles(s.tokens)]);
  // counts as counts (`fmtNumber`, as `torchyard datasets show`); an id and a dtype as they are
  for (const key of ["num_tokens", "supervised_tokens", "max_token_id", "token_dtype"]) {
    const count = key === "num_tokens" || key === "supervised_tokens";
    if (s[key] !== null && s[key] !== undefined) rows.push([key.replaceAll("_", " "), count ? fmtNumber(s[key]) : s[key]]);
  }
  return h("dl", { class: "kv", id: "dataset-stats" },
    rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { dataset: { stat: k } }, String(v))]));
}

function warningsList(ds) {
  const warnings = ds.stats?.warnings ?? [];
  const left = leftOut(ds);
  const fixed = repaired(ds);
  if (!warnings.length && !left && !fixed) {
    return h("p", { class: "muted", id: "dataset-warnings" }, "No warnings.");
  }
  return h("ul", { class: "errors", id: "dataset-warnings" }, left ?? "", fixed ?? "",
    warnings.map((w) =>
    h("li", {}, `${w.message}: ${w.count} (first ${w.first})`)));
}

/** A directory's binary files (their first MiB is not UTF-8 text): counted, the first few
 * named; no job reads them. Null when there are none. */
function leftOut(ds) {
  const left = ds.left_out;
  if (!left?.files) return null;
  const count = (n) => n.toLocaleString("en");
  const share = left.of_bytes ? Math.round((100 * left.bytes) / left.of_bytes) : 0;
  const more = left.files - left.examples.length;
  return h("li", { id: "dataset-left-out" },
    `Not UTF-8 text, never read by a job: ${count(left.files)} of ${count(left.of_files)} files, `,
    `${share}% of bytes (${fmtBytes(left.bytes)}).`,
    h("ul", {}, left.examples.map((e) => h("li", { class: "left-out-file" },
      h("code", {}, e.path), ` ${fmtBytes(e.size_bytes)}: `,
      e.reason.slice(e.path.length + 2))),
    more > 0 ? h("li", { class: "muted" }, `and ${count(more)} more`) : ""));
}

/** Text files holding stray bytes further on, which a job drops as it reads. */
function repaired(ds) {
  const left = ds.left_out;
  if (!left?.repaired_files) return null;
  const more = left.repaired_files - left.repaired.length;
  return h("li", { id: "dataset-repaired" },
    `Text with stray bytes a job drops: ${left.repaired_files.toLocaleString("en")} files.`,
    h("ul", {}, left.repaired.map((e) => h("li", { class: "repaired-file" },
      h("code", {}, e.path), `: ${e.reason.slice(e.path.length + 2)}`)),
    more > 0 ? h("li", { class: "muted" }, `and ${more.toLocaleString("en")} more`) : ""));
}

function choice(id, label, values, selected) {
  return h("label", {}, `${label} `, h("select", { id },
    values.map(([value, text]) => h("option", { value, selected: value === selected }, text))));
}

function tokenSpan(piece, supervised, role, id) {
  return h("span", {
    class: supervised ? "tok supervised" : "tok unsupervised",
    title: `${role} · id ${id}${supervised ? " · supervised" : ""}`,
    dataset: { role },
  }, piece);
}

function exampleBlock(example) {
  const count = example.supervised.filter(Boolean).length;
  return h("div", { class: "preview-example", dataset: { where: example.where } },
    h("div", { class: "muted" }, `${example.where} · ${example.status} · `,
      `${example.num_tokens} tokens, ${count} supervised`,
      example.num_tokens > example.tokens.length ? ` (first ${example.tokens.length} shown)` : ""),
    h("pre", { class: "tokens" }, example.tokens.map((piece, i) => tokenSpan(
      piece, example.supervised[i], example.roles[i], example.input_ids[i]))));
}

function rolesTable(report) {
  return h("table", { id: "preview-roles" },
    h("thead", {}, h("tr", {}, h("th", {}, "Role"), h("th", { class: "num" }, "Tokens"),
      h("th", { class: "num" }, "Supervised"), h("th", { class: "num" }, "Share"))),
    h("tbody", {}, Object.keys(report.tokens_by_role).sort().map((role) =>
      h("tr", { dataset: { role } }, h("td", {}, role),
        h("td", { class: "num" }, fmtNumber(report.tokens_by_role[role])),
        h("td", { class: "num" }, fmtNumber(report.supervised_by_role[role] ?? 0)),
        h("td", { class: "num" },
          `${(100 * (report.supervised_share_by_role[role] ?? 0)).toFixed(1)}%`)))));
}

function showPreview(out, shown) {
  const r = shown.report;
  out.replaceChildren(
    h("p", { id: "preview-verdict", class: `verdict verdict-${shown.verdict}` },
      shown.refused ? `Refused: ${shown.refused}` : "OK: a job would train on this sample."),
    h("p", { class: "muted" }, `${shown.tokenizer} · loss_on ${shown.loss_on} · seq_len `,
      `${shown.seq_len} · ${r.examples} examples, ${r.dropped} dropped, ${r.truncated} `,
      `truncated, ${r.lost_all_supervision} lost all supervision`),
    rolesTable(r),
    h("p", { class: "legend" }, h("span", { class: "tok supervised" }, "supervised"), " ",
      h("span", { class: "tok unsupervised" }, "not supervised"),
      h("span", { class: "muted" }, " · hover a token for its role and id")),
    h("div", { id: "preview-examples" }, shown.examples.map(exampleBlock)));
}

function previewPanel(ds) {
  if (!PREVIEWABLE.has(ds.format)) {
    return h("p", { class: "muted", id: "preview-unavailable" },
      `A ${ds.format} dataset has no records to render: there is no mask to preview.`);
  }
  const template = choice("preview-template", "Template", [
    ["", "model's own (else ChatML)"], ["chatml", "ChatML"], ["custom", "Jinja…"]], "");
  const jinja = h("textarea", {
    id: "preview-jinja", rows: 4, hidden: true, placeholder: "{% for m in messages %}…",
    "aria-label": "Jinja chat template",
  });
  template.querySelector("select").addEventListener("change", (event) => {
    jinja.hidden = event.target.value !== "custom";
  });
  const modelPath = h("input", {
    id: "preview-model-path", placeholder: "byte-level GPT", size: 28,
    "aria-label": "server-side model directory",
  });
  const lossOn = choice("preview-loss-on", "Loss on", [["", "default"],
    ["assistant", "assistant"], ["completion", "completion"], ["all", "all"]], "");
  const truncation = choice("preview-truncation", "Truncation", [["drop", "drop"],
    ["truncate_left", "truncate left"], ["truncate_right", "truncate right"]], "drop");
  const seqLen = h("input", { id: "preview-seq-len", type: "number", min: 8, value: 1024,
    "aria-label": "seq_len" });
  const count = h("input", { id: "preview-n", type: "number", min: 1, max: 64, value: 4,
    "aria-label": "examples" });
  const out = h("div", { id: "preview-result" });
  const run = h("button", { id: "preview-run", class: "primary", type: "button" }, "Preview");
  run.addEventListener("click", async () => {
    const kind = template.querySelector("select").value;
    const body = {
      chat_template: kind === "custom" ? jinja.value : kind || null,
      loss_on: lossOn.querySelector("select").value || null,
      truncation: truncation.querySelector("select").value,
      seq_len: Number(seqLen.value) || null,
      num_examples: Number(count.value) || 4,
    };
    if (modelPath.value.trim()) {
      body.model = { kind: "hf", hf: { path_or_id: modelPath.value.trim() } };
    }
    run.disabled = true;
    out.replaceChildren(h("p", { class: "muted" }, "Tokenizing…"));
    try {
      showPreview(out, await api(`/v1/datasets/${ds.id}/preview`, { method: "POST", body }));
    } catch (err) {
      out.replaceChildren(h("ul", { class: "errors", id: "preview-errors" },
        (err.details?.length ? err.details : [{ loc: [], msg: err.message }]).map((d) =>
          h("li", {}, h("code", {}, d.loc.filter((p) => p !== "body").join(".")), " ", d.msg))));
    } finally {
      run.disabled = false;
    }
  });
  return h("div", {},
    h("div", { class: "toolbar" }, template, h("label", {}, "Model ", modelPath), lossOn,
      truncation, h("label", {}, "seq_len ", seqLen), h("label", {}, "Examples ", count), run),
    jinja, out);
}

/** The dataset's first files with their sizes; how many more there are. */
function filesPanel(ds) {
  const out = h("div", { id: "dataset-files" }, h("p", { class: "muted" }, "Listing…"));
  api(`/v1/datasets/${ds.id}/files?limit=${FILES_SHOWN}`).then(({ items, next_cursor }) => {
    out.replaceChildren(
      h("div", { class: "table-wrap scroll-y" }, h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "Path"), h("th", { class: "num" }, "Size"))),
        h("tbody", {}, items.map((f) => h("tr", { dataset: { path: f.path } },
          h("td", { class: "wrap" }, h("code", {}, f.path)),
          h("td", { class: "num" }, fmtBytes(f.size_bytes))))))),
      next_cursor ? h("p", { class: "muted", id: "dataset-files-more" },
        `The first ${items.length} of ${fmtNumber(ds.num_files)} files; `,
        h("code", {}, `torchyard datasets files ${ds.name} --limit ${ds.num_files}`),
        " lists them all.") : "");
  }).catch((err) => out.replaceChildren(h("p", { class: "muted" }, err.message)));
  return out;
}

/** The dataset's first records as a job reads them (long values cut). */
function samplePanel(ds) {
  const out = h("div", { id: "dataset-sample" }, h("p", { class: "muted" }, "Reading…"));
  api(`/v1/datasets/${ds.id}/sample?limit=${RECORDS_SHOWN}`).then(({ items }) => {
    out.replaceChildren(...items.map((item) => h("div", {
      class: "sample-record", dataset: { where: item.where },
    },
    h("div", { class: "muted" }, item.where, item.truncated ? " · long values cut" : ""),
    h("pre", { class: "record" }, typeof item.record === "string"
      ? item.record : JSON.stringify(item.record)))));
  }).catch((err) => out.replaceChildren(h("p", { class: "muted" }, err.message)));
  return out;
}

/** The newest jobs whose spec names this dataset (GET /v1/jobs?dataset=). */
function jobsPanel(ds) {
  const out = h("div", { id: "dataset-jobs" }, h("p", { class: "muted" }, "Loading…"));
  api(`/v1/jobs?dataset=${encodeURIComponent(ds.id)}&limit=${JOBS_SHOWN}`).then(
    ({ items, next_cursor }) => {
      if (!items.length) {
        out.replaceChildren(h("p", { class: "muted" }, "No job has used it yet."));
        return;
      }
      out.replaceChildren(h("div", { class: "table-wrap" }, h("table", {},
        h("thead", {}, h("tr", {}, ["Job", "Name", "State", "Created"].map((c) => h("th", {}, c)))),
        h("tbody", {}, items.map((job) => h("tr", { dataset: { jobId: job.id } },
          h("td", {}, h("a", { href: `#/jobs/${job.id}` }, `#${job.id}`)),
          h("td", {}, h("a", { href: `#/jobs/${job.id}` }, job.name)),
          h("td", {}, stateBadge(job.state)),
          h("td", {}, fmtTime(job.created_at))))))),
      next_cursor ? h("p", { class: "muted" }, `The newest ${items.length}; `,
        h("code", {}, `torchyard jobs --dataset ${ds.name}`), " lists them all.") : "");
    }).catch((err) => out.replaceChildren(h("p", { class: "muted" }, err.message)));
  return out;
}

export function datasetPage(root, datasetId) {
  let stopped = false;
  api(`/v1/datasets/${encodeURIComponent(datasetId)}`).then((ds) => {
    if (stopped) return;
    const id = h("code", { id: "dataset-id" }, ds.id);
    root.append(
      h("h1", {}, h("a", { href: "#/datasets" }, "Datasets"), " / ",
        h("span", { id: "dataset-name" }, ds.name)),
      h("p", { id: "dataset-ref", class: "muted" }, "A spec names it as ",
        h("code", {}, `data.dataset: ${ds.name}`), " or by its id ", id, " ", copyButton(ds.id, id),
        " ", h("a", {
          id: "dataset-use", class: "button primary",
          href: `#/submit?dataset=${encodeURIComponent(ds.id)}`,
        }, "Use in a new job")),
      h("div", { class: "panel" }, statsList(ds)),
      h("h2", {}, "Warnings"), warningsList(ds),
      h("h2", {}, "Jobs that used it"), jobsPanel(ds),
      h("h2", {}, "Sample"), samplePanel(ds),
      h("h2", {}, `Files (${fmtNumber(ds.num_files)})`), filesPanel(ds),
      h("h2", {}, "Mask preview"),
      h("div", { class: "panel", id: "preview-panel" }, previewPanel(ds)));
    root.dataset.loaded = "true";
  }).catch((err) => {
    if (!stopped) root.append(h("p", { id: "dataset-error", class: "muted" }, err.message));
  });
  return () => { stopped = true; };
}
