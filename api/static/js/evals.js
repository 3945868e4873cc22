// Evaluations (GET /v1/jobs/{id}/evals): the job page's Evals card (each score at each evaluated
// step, the base model's first and the change from it; a generate evaluation's answers beside
// their prompts and references, a reward evaluation's completions beside their rewards) and the compare view's eval rows. On an eval job's own page
// the card leads: its scores, the job and checkpoint it scored, and the starting weights'
// scores beside them where another eval job measured them (read from the source's evals).
import { api } from "./api.js";
import { fmtNumber, h } from "./util.js";

// Bookkeeping, not scores: counts, lm-eval's stderrs and sample lengths, completion lengths and
// graders' faults.
const NOT_SCORES = /(^|[./])(tokens|rows|answers|samples|sample_len|completion_length)$|_stderr(@.*)?$|(^|[./])grader_(errors|timeouts)\//;
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

/** The kind badge of an eval job's title, as `scriptBadge` is a script job's. */
export function evalBadge() {
  return h("span", { class: "kind kind-eval", dataset: { kind: "eval" },
    title: "scores a checkpoint of another job (evaluate)" }, "eval");
}

/** An eval job's `evaluate.source` ({job, checkpoint, initial}), or null for another kind. */
export function evalSourceOf(job) {
  const source = job?.spec?.evaluate?.source;
  return source && typeof source === "object" ? source : null;
}

/** The weights an eval job scored, linked: the source job's page, and its checkpoint's row. */
export function sourceNode(source, step) {
  const jobLink = h("a", { href: `#/jobs/${source.job}`, id: "eval-source-job" }, `job #${source.job}`);
  if (source.initial) return h("span", { id: "eval-source" }, jobLink, "'s starting weights");
  const at = step === null || step === undefined ? "" : ` (step ${step})`;
  return h("span", { id: "eval-source" }, jobLink, "'s ",
    h("a", { href: `#/jobs/${source.job}?checkpoint=${source.checkpoint}`, id: "eval-source-checkpoint" },
      `checkpoint ${source.checkpoint}${at}`));
}

/** Of the source job's evals, this eval job's and, unless it scored the starting weights
 * itself, the baseline's (another eval job's, on the starting weights). */
function ownAndBaseline(items, jobId, source) {
  const own = items.filter((i) => i.job_id === jobId);
  if (source.initial) return own;
  const names = new Set(own.map((i) => i.name));
  const base = items.filter((i) => i.job_id !== jobId && i.checkpoint_id === null
    && i.step === 0 && names.has(i.name));
  return [...base, ...own];
}

// `self`: the page's own job, whose scores are not linked (a link to the page itself).
function scoresNode(items, self = null) {
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
        const value = cell.job_id === self ? fmtNumber(cell.value)
          : h("a", { href: `#/jobs/${cell.job_id}`, title: `eval job #${cell.job_id}` },
            fmtNumber(cell.value));
        return h("td", { class: "num", dataset: { column: c } }, value);
      }),
      hasBase ? change(key, cells.get("base")?.value, cells.get(last)?.value) : null))));
}

/** A sample's answer: a generate evaluation's `answer`, a reward evaluation's `completion`. */
function answerOf(sample) {
  return sample?.answer ?? sample?.completion ?? "";
}

/** A generate or reward evaluation's answers at its latest step, the base model's answer beside
 * each; a generate answer is scored by its chrF against the reference, a reward completion by
 * its reward (the graders' weighted sum). */
function answersNode(items) {
  const generated = items.filter((i) => (i.kind === "generate" || i.kind === "reward")
    && (i.samples ?? []).length);
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
    const reward = latest.kind === "reward";
    const score = (s) => fmtNumber(reward ? s?.reward : s?.chrf);
    return h("details", { dataset: { eval: name } },
      h("summary", {}, `${name}: ${latest.samples.length} answers at ${stepLabel(latest)}`),
      h("div", { class: "table-wrap" }, h("table", { class: "answers" },
        h("thead", {}, h("tr", {}, h("th", {}, "prompt"), reward ? null : h("th", {}, "reference"),
          h("th", {}, `answer (${stepLabel(latest)})`), base ? h("th", {}, "answer (base)") : null,
          h("th", { class: "num" }, reward ? "reward" : "chrF"),
          reward && base ? h("th", { class: "num" }, "reward (base)") : null)),
        h("tbody", {}, latest.samples.map((s, i) => h("tr", { dataset: { sample: i } },
          h("td", {}, h("pre", {}, s.prompt)), reward ? null : h("td", {}, h("pre", {}, s.reference)),
          h("td", { class: s.exact_match ? "better" : "" }, h("pre", {}, answerOf(s))),
          base ? h("td", {}, h("pre", {}, answerOf(base.samples[i]))) : null,
          h("td", { class: "num", dataset: reward ? { reward: "" } : {} }, score(s)),
          reward && base ? h("td", { class: "num" }, score(base.samples[i])) : null))))));
  }));
}

/** The evals an eval job's card shows: its own and the baseline's, from its source's list
 * (its own alone once the source job is gone). */
async function evalJobItems(jobId, source) {
  try {
    const { items } = await api(`/v1/jobs/${source.job}/evals`);
    return ownAndBaseline(items, jobId, source);
  } catch (err) {
    if (err.status !== 404) throw err;
    return (await api(`/v1/jobs/${jobId}/evals`)).items;
  }
}

/**
 * The job page's Evals card: hidden until the job has evaluations; `load(job)` refreshes it.
 * An eval job's (`evaluate`) is its "Scores": shown from the start, with the weights scored.
 */
export function evalsCard(jobId) {
  const body = h("div");
  const heading = h("h2", {}, "Evaluations");
  const lead = h("p", { id: "evals-source-line", hidden: true });
  const node = h("section", { id: "evals", hidden: true }, heading, h("div", { class: "panel" }, lead, body));
  let shown = "";
  async function load(job) {
    const source = evalSourceOf(job);
    const items = source ? await evalJobItems(jobId, source) : (await api(`/v1/jobs/${jobId}/evals`)).items;
    const key = JSON.stringify([source, items.map((i) => [i.id, i.step, i.metrics])]);
    if (key === shown) return;
    shown = key;
    node.hidden = !items.length && !source;
    if (source) {
      heading.textContent = "Scores";
      const own = items.find((i) => i.job_id === jobId);
      lead.hidden = false;
      lead.replaceChildren("Scores of ", sourceNode(source, own?.step ?? null));
    }
    body.replaceChildren(
      items.length ? h("div", { class: "table-wrap" }, scoresNode(items, jobId))
        : h("p", { class: "muted", id: "evals-none" }, "No scores reported yet."),
      answersNode(items) ?? "");
  }
  return { node, load };
}

/** Each run's latest scores, for the compare view's eval rows. */
export async function latestScoresOf(jobIds) {
  const answers = await Promise.all(jobIds.map((id) => api(`/v1/jobs/${id}/evals`)));
  return answers.map(({ items }) => latestScores(items));
}
