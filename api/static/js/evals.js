// Evaluations (GET /v1/jobs/{id}/evals): the job page's Evals card (each score at each evaluated
// step, the base model's first and the change from it; a generate evaluation's answers beside
// their prompts and references) and the compare view's eval rows.
import { api } from "./api.js";
import { fmtNumber, h } from "./util.js";

// Bookkeeping, not scores: counts, lm-eval's stderrs and sample lengths.
const NOT_SCORES = /(^|[./])(tokens|rows|answers|samples|sample_len)$|_stderr(@.*)?$/;
// Scores where lower is better (the change from the base is good when negative).
const LOWER_IS_BETTER = /(^|[./])(loss|perplexity|word_perplexity|byte_perplexity|bits_per_byte)(@.*)?$/;

/** The evaluation's label at `step`: the starting weights (no checkpoint) are "base". */
export function stepLabel(item) {
  return item.checkpoint_id === null && item.step === 0 ? "base" : `step ${item.step}`;
}

/**
 * Scores by row: [[`<name>.<metric>`, Map(column label -> {value, job_id})]] sorted by name
 * then metric, and the column labels in order (base first, then by step).
 */
export function scoreTable(items) {
  const rows = new Map();
  const columns = new Map();
  for (const item of items) {
    const column = stepLabel(item);
    columns.set(column, item.checkpoint_id === null && item.step === 0 ? -1 : item.step);
    for (const [metric, value] of Object.entries(item.metrics ?? {})) {
      if (NOT_SCORES.test(metric)) continue;
      const key = `${item.name}.${metric}`;
      if (!rows.has(key)) rows.set(key, new Map());
      rows.get(key).set(column, { value, job_id: item.job_id });
    }
  }
  const ordered = [...columns.entries()].sort((a, b) => a[1] - b[1]).map(([label]) => label);
  const sorted = [...rows.entries()].sort((a, b) => a[0].localeCompare(b[0], "en", { numeric: true }));
  return { rows: sorted, columns: ordered };
}

/** `{<name>.<metric>: value}` at each evaluation's latest step (what compare shows per run). */
export function latestScores(items) {
  const latest = new Map();
  for (const item of items) {
    const seen = latest.get(item.name);
    if (!seen || item.step > seen.step) latest.set(item.name, item);
  }
  const out = {};
  for (const item of latest.values()) {
    for (const [metric, value] of Object.entries(item.metrics ?? {})) {
      if (!NOT_SCORES.test(metric)) out[`${item.name}.${metric}`] = value;
    }
  }
  return out;
}

function change(key, base, last) {
  if (typeof base !== "number" || typeof last !== "number") return h("td", { class: "num muted" }, "–");
  const delta = last - base;
  const better = LOWER_IS_BETTER.test(key) ? delta < 0 : delta > 0;
  const sign = delta > 0 ? "+" : "";
  return h("td", { class: `num ${delta === 0 ? "muted" : better ? "better" : "worse"}`, dataset: { change: "" } },
    `${sign}${fmtNumber(delta)}`);
}

function scoresNode(items) {
  const { rows, columns } = scoreTable(items);
  const hasBase = columns[0] === "base" && columns.length > 1;
  const last = columns[columns.length - 1];
  return h("table", { id: "evals-table" },
    h("thead", {}, h("tr", {}, h("th", {}, "score"),
      columns.map((c) => h("th", { class: "num" }, c)),
      hasBase ? h("th", { class: "num" }, "vs base") : null)),
    h("tbody", {}, rows.map(([key, cells]) => h("tr", { dataset: { score: key } },
      h("th", {}, key),
      columns.map((c) => {
        const cell = cells.get(c);
        if (!cell) return h("td", { class: "num muted" }, "–");
        return h("td", { class: "num", dataset: { column: c } },
          h("a", { href: `#/jobs/${cell.job_id}`, title: `eval job #${cell.job_id}` },
            fmtNumber(cell.value)));
      }),
      hasBase ? change(key, cells.get("base")?.value, cells.get(last)?.value) : null))));
}

/** A generate evaluation's answers at its latest step, the base model's answer beside each. */
function answersNode(items) {
  const generated = items.filter((i) => i.kind === "generate" && (i.samples ?? []).length);
  if (!generated.length) return null;
  const byName = new Map();
  for (const item of generated) {
    if (!byName.has(item.name)) byName.set(item.name, []);
    byName.get(item.name).push(item);
  }
  return h("div", { id: "evals-answers" }, [...byName.entries()].map(([name, runs]) => {
    runs.sort((a, b) => a.step - b.step);
    const latest = runs[runs.length - 1];
    const base = runs.find((r) => stepLabel(r) === "base" && r !== latest);
    return h("details", { dataset: { eval: name } },
      h("summary", {}, `${name}: ${latest.samples.length} answers at ${stepLabel(latest)}`),
      h("div", { class: "table-wrap" }, h("table", { class: "answers" },
        h("thead", {}, h("tr", {}, h("th", {}, "prompt"), h("th", {}, "reference"),
          h("th", {}, `answer (${stepLabel(latest)})`), base ? h("th", {}, "answer (base)") : null,
          h("th", { class: "num" }, "chrF"))),
        h("tbody", {}, latest.samples.map((s, i) => h("tr", { dataset: { sample: i } },
          h("td", {}, h("pre", {}, s.prompt)), h("td", {}, h("pre", {}, s.reference)),
          h("td", { class: s.exact_match ? "better" : "" }, h("pre", {}, s.answer)),
          base ? h("td", {}, h("pre", {}, base.samples[i]?.answer ?? "")) : null,
          h("td", { class: "num" }, fmtNumber(s.chrf))))))));
  }));
}

/** The job page's Evals card: hidden until the job has evaluations; `load()` refreshes it. */
export function evalsCard(jobId) {
  const body = h("div");
  const node = h("section", { id: "evals", hidden: true },
    h("h2", {}, "Evaluations"), h("div", { class: "panel" }, body));
  let shown = "";
  async function load() {
    const { items } = await api(`/v1/jobs/${jobId}/evals`);
    const key = JSON.stringify(items.map((i) => [i.id, i.step, i.metrics]));
    if (key === shown) return;
    shown = key;
    node.hidden = !items.length;
    body.replaceChildren(h("div", { class: "table-wrap" }, scoresNode(items)), answersNode(items) ?? "");
  }
  return { node, load };
}

/** Each run's latest scores, for the compare view's eval rows. */
export async function latestScoresOf(jobIds) {
  const answers = await Promise.all(jobIds.map((id) => api(`/v1/jobs/${id}/evals`)));
  return answers.map(({ items }) => latestScores(items));
}
