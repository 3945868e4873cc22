// Compare: N runs x M metrics, one chart per metric with a line per run, against step, tokens
// seen or wall time; EMA smoothing (the raw line faint behind), a log scale, and a table of
// what differs between the runs' specs and how they ended. The whole view is in the address
// (#/compare?ids=3,4&metrics=loss,lr&x=tokens&smooth=0.6&log=1): a link shows the same view.

import { api } from "./api.js";
import { COLORS, lineChart, purge } from "./charts.js";
import { entrypointOf } from "./code.js";
import {
  SCHEDULES, X_AXES, configDiff, ema, finals, metricGroup, metricLabel, plotValue, startTime,
  tokensPerStep, xValues,
} from "./compare_data.js";
import { latestScoresOf } from "./evals.js";
import { TERMINAL, fmtNumber, h, poll, showError, stateBadge } from "./util.js";

const REFRESH_MS = 2000;
const MAX_POINTS = 2000;
const DEFAULT_METRICS = ["loss", "eval_loss"];
const REWARD_METRICS = ["reward", "eval_reward"]; // GRPO runs are read by their rewards
// Always fetched: the results table's losses and what the tokens axis is derived from.
const SUPPORT = ["loss", "eval_loss", "tokens_per_second", "step_time_s"];
const MAX_SMOOTH = 0.99;

/** The view's state from the address; `metric=` (one) is the older form of `metrics=`. */
export function readState(query) {
  const ids = (query.get("ids") ?? "").split(",").map(Number)
    .filter((n) => Number.isInteger(n) && n > 0);
  const list = query.get("metrics") ?? query.get("metric");
  const smooth = Number(query.get("smooth") ?? 0);
  return {
    ids: [...new Set(ids)],
    metrics: list ? list.split(",").filter(Boolean) : null, // null: the defaults
    x: Object.hasOwn(X_AXES, query.get("x") ?? "") ? query.get("x") : "step",
    smooth: Number.isFinite(smooth) ? Math.min(MAX_SMOOTH, Math.max(0, smooth)) : 0,
    log: query.get("log") === "1",
  };
}

function address(state) {
  const params = new URLSearchParams({ ids: state.ids.join(",") });
  if (state.metrics) params.set("metrics", state.metrics.join(","));
  if (state.x !== "step") params.set("x", state.x);
  if (state.smooth > 0) params.set("smooth", String(state.smooth));
  if (state.log) params.set("log", "1");
  return `#/compare?${params}`.replaceAll("%2C", ",");
}

function runLabel(job) {
  const strategy = entrypointOf(job) ? "script" : (job.spec?.parallelism?.strategy ?? "");
  return `#${job.id} ${job.name}${strategy ? ` (${strategy})` : ""}`;
}

// A chosen metric drawn in another's chart (dotted), as on the job page: eval_loss with loss.
const JOINS = { eval_loss: "loss" };
const PICKER_RUNS = 200; // the newest jobs offered by the run picker

/** The charts for `metrics`: [chart metric, [metrics drawn in it]], in the picker's order. */
export function chartGroups(metrics) {
  const groups = new Map();
  for (const metric of metrics) {
    const host = metrics.includes(JOINS[metric]) ? JOINS[metric] : metric;
    if (!groups.has(host)) groups.set(host, []);
    groups.get(host).push(metric);
  }
  return [...groups].map(([host, drawn]) => [host, [host, ...drawn.filter((m) => m !== host)]]);
}

/** "#7 long-run · succeeded · team=nlp": what the run picker lists and searches. */
function pickerLabel(job) {
  const labels = Object.entries(job.labels ?? {}).map(([k, v]) => `${k}=${v}`);
  return [`#${job.id} ${job.name}`, job.state, ...labels].join(" · ");
}

/** The runs' processes per node when they agree (a rank's node), else null. */
function procsPerNode(jobs) {
  const counts = new Set(jobs.map((job) => job.spec?.resources?.procs_per_node ?? null));
  return counts.size === 1 ? [...counts][0] : null;
}

function metricNames(runs) {
  const names = [...new Set(runs.flatMap((r) => Object.keys(r.job.latest_metrics ?? {})))];
  const system = (n) => n.startsWith("sys/");
  return names.sort((a, b) => system(a) - system(b) || a.localeCompare(b, "en", { numeric: true }));
}

function cellText(value) {
  if (value === undefined || value === null) return "–";
  return typeof value === "number" ? fmtNumber(value) : String(value);
}

/** Runs as columns: the spec fields that differ, then state, steps, tokens and losses. */
function diffTable(runs, scores) {
  const diff = configDiff(runs.map((r) => r.job.spec));
  const row = (label, values, data) => h("tr", { dataset: data },
    h("th", {}, label), values.map((v) => h("td", { class: typeof v === "number" ? "num" : "" },
      v instanceof Node ? v : cellText(v))));
  const section = (text) => h("tr", { class: "section" },
    h("th", { colspan: runs.length + 1, class: "muted" }, text));
  const rewards = runs.some((r) => r.byName.has("eval_reward") || r.byName.has("reward"));
  const results = runs.map((r) => finals(r.byName, rewards));
  const steps = runs.map((r) => r.job.current_step);
  return h("table", { id: "compare-diff" },
    h("thead", {}, h("tr", {}, h("th", {}, "field"),
      runs.map((r, i) => h("th", { style: `border-bottom: 3px solid ${COLORS[i % COLORS.length]}` },
        h("a", { href: `#/jobs/${r.job.id}` }, `#${r.job.id} ${r.job.name}`))))),
    h("tbody", {},
      section(runs.length < 2 ? "config: pick two runs or more to see what differs"
        : diff.length ? "config: the fields that differ" : "config: the specs are the same"),
      diff.map(([path, values]) => row(path, values, { field: path })),
      section("results"),
      row("state", runs.map((r) => stateBadge(r.job.state)), { result: "state" }),
      row("steps", steps, { result: "steps" }),
      row("tokens seen", runs.map((r, i) => (r.tokensPerStep && steps[i] ? steps[i] * r.tokensPerStep : null)),
        { result: "tokens seen" }),
      results[0].map(([label], k) => row(label, results.map((f) => f[k][1]), { result: label })),
      evalRows(runs, scores, row, section)));
}

/** The runs' evaluations (their latest step's scores), one row per `<name>.<metric>`. */
function evalRows(runs, scores, row, section) {
  const keys = [...new Set(scores.flatMap((s) => Object.keys(s)))]
    .sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  if (!keys.length) return [];
  return [section("evaluations (latest step)"),
    ...keys.map((key) => row(key, scores.map((s) => s[key] ?? null), { evalScore: key }))];
}

export function comparePage(root, query) {
  const state = readState(query);
  const keepInUrl = () => { // shareable, without a hashchange (which would rebuild the page)
    const hash = address(state);
    if (window.location.hash !== hash) history.replaceState(null, "", hash);
  };
  const idsInput = h("input", { id: "compare-ids", value: state.ids.join(","), placeholder: "job ids, e.g. 12,15" });
  const apply = h("button", { type: "button", class: "primary", id: "compare-apply" }, "Compare");
  apply.addEventListener("click", () => {
    const ids = readState(new URLSearchParams({ ids: idsInput.value.replace(/\s+/g, "") })).ids;
    window.location.hash = address({ ...state, ids });
  });
  // A searchable run picker: the newest jobs by id, name, state and labels (the browser's own
  // datalist search); picking one adds it to the view.
  const runOptions = h("datalist", { id: "compare-run-options" });
  const runSearch = h("input", { id: "compare-add", list: "compare-run-options", size: 36,
    placeholder: "add a run: name, label or state…", "aria-label": "add a run" });
  const byLabel = new Map();
  api("/v1/jobs", { query: { limit: PICKER_RUNS } }).then(({ items }) => {
    for (const job of items) byLabel.set(pickerLabel(job), job.id);
    runOptions.replaceChildren(...items.map((job) => h("option", { value: pickerLabel(job) })));
  }).catch(showError);
  runSearch.addEventListener("change", () => {
    const id = byLabel.get(runSearch.value) ?? Number((/^#?(\d+)/.exec(runSearch.value) ?? [])[1]);
    if (!id || state.ids.includes(id)) return;
    window.location.hash = address({ ...state, ids: [...state.ids, id] });
  });
  const metricsBox = h("fieldset", { id: "compare-metrics", class: "toolbar" }, h("legend", {}, "metrics"));
  const xSel = h("select", { id: "compare-x", "aria-label": "x axis" },
    Object.entries(X_AXES).map(([v, a]) => h("option", { value: v, selected: v === state.x }, a.title)));
  const smooth = h("input", {
    id: "compare-smooth", type: "range", min: "0", max: String(MAX_SMOOTH), step: "0.01",
    value: String(state.smooth), "aria-label": "smoothing",
  });
  const smoothOut = h("output", { id: "compare-smooth-value", for: "compare-smooth" }, state.smooth.toFixed(2));
  const log = h("input", { id: "compare-log", type: "checkbox", checked: state.log });
  const charts = h("div", { class: "grid2", id: "compare-charts" });
  const note = h("p", { class: "muted", id: "compare-note" });
  const tableBox = h("div", { class: "table-wrap", id: "compare-table" });
  const chartNodes = new Map();
  let runs = [];
  let stopped = false;

  xSel.addEventListener("change", () => { state.x = xSel.value; changed(); });
  smooth.addEventListener("input", () => {
    state.smooth = Number(smooth.value);
    smoothOut.textContent = state.smooth.toFixed(2);
    changed();
  });
  log.addEventListener("change", () => { state.log = log.checked; changed(); });
  function changed({ refetch = false } = {}) {
    keepInUrl();
    if (refetch) load().catch(showError); else render().catch(showError);
  }

  function chosenMetrics(names) {
    if (state.metrics) return state.metrics;
    const preferred = names.includes("reward") ? REWARD_METRICS : DEFAULT_METRICS;
    const defaults = preferred.filter((n) => names.includes(n));
    return defaults.length ? defaults : names.slice(0, 1);
  }

  function renderPicker(names) {
    const chosen = chosenMetrics(names);
    const shown = [...metricsBox.querySelectorAll("input")].map((i) => i.value);
    if (JSON.stringify(shown) === JSON.stringify(names)) return;
    const item = (name) => {
      const box = h("input", { type: "checkbox", name: "metric", value: name, checked: chosen.includes(name) });
      box.addEventListener("change", () => {
        const picked = [...metricsBox.querySelectorAll("input:checked")].map((i) => i.value);
        state.metrics = names.filter((n) => picked.includes(n));
        changed({ refetch: true });
      });
      return h("label", { title: name }, box, ` ${metricLabel(name)}`);
    };
    // train, eval, then the system series node by node
    const ppn = procsPerNode(runs.map((r) => r.job));
    const system = [...new Set(names.map((n) => metricGroup(n, ppn)))]
      .filter((g) => g.startsWith("system")).sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
    const groups = ["train", "eval", ...system];
    metricsBox.replaceChildren(h("legend", {}, "metrics"), ...groups
      .map((group) => [group, names.filter((n) => metricGroup(n, ppn) === group)])
      .filter(([, members]) => members.length)
      .map(([group, members]) => h("span", { class: "metric-group", dataset: { group } },
        h("strong", { class: "muted" }, group), ...members.map(item))));
  }

  async function render() {
    if (stopped || !runs.length) return;
    const groups = chartGroups(chosenMetrics(metricNames(runs)));
    const hosts = groups.map(([host]) => host);
    for (const [metric, node] of chartNodes) {
      if (!hosts.includes(metric)) { purge(node); node.remove(); chartNodes.delete(metric); }
    }
    const axis = X_AXES[state.x];
    const lacking = new Set();
    for (const [metric, drawn] of groups) {
      let node = chartNodes.get(metric);
      if (!node) {
        node = h("div", { class: "panel chart", id: `compare-chart-${metric.replace(/[^A-Za-z0-9_-]/g, "_")}`,
          dataset: { metric } });
        chartNodes.set(metric, node);
      }
      charts.append(node); // in the picker's order
      const traces = drawn.flatMap((name, k) => runs.flatMap((run, i) => {
        const s = run.byName.get(name);
        const x = s && xValues(run, s, state.x);
        if (!s) return [];
        if (!x) { lacking.add(run.job.id); return []; }
        const y = s.values.map(plotValue);
        const base = { name: k ? `${runLabel(run.job)} ${metricLabel(name)}` : runLabel(run.job), x,
          color: COLORS[i % COLORS.length], ...(k ? { dash: "dot" } : {}) };
        const meta = { job: run.job.id, metric: name };
        const raw = { ...base, y, meta: { ...meta, kind: "raw" } };
        if (!(state.smooth > 0) || SCHEDULES.has(name)) return [raw];
        return [{ ...raw, opacity: 0.25, legend: false, hover: false },
          { ...base, y: ema(y, state.smooth), meta: { ...meta, kind: "smoothed" } }];
      }));
      await lineChart(node, traces, {
        title: drawn.map(metricLabel).join(" and "), xTitle: axis.title, xFormat: axis.format,
        xHover: axis.hover, yLog: state.log,
        uirevision: `${state.x}|${state.log}`, hovermode: "x unified",
      });
    }
    note.textContent = lacking.size ? `No ${axis.title} for ${[...lacking].map((id) => `#${id}`).join(", ")}: `
      + (state.x === "tokens" ? "it reports no tokens_per_second and step_time_s." : "its points have no time.") : "";
    root.dataset.view = address(state); // what the charts show, for tests
  }

  async function load() {
    if (!state.ids.length) {
      charts.replaceChildren(h("p", { class: "muted" }, "Pick jobs on the Jobs page (cmp column) or type their ids."));
      root.dataset.loaded = "true";
      return;
    }
    const jobs = await Promise.all(state.ids.map((id) => api(`/v1/jobs/${id}`)));
    const names = metricNames(jobs.map((job) => ({ job })));
    const wanted = [...new Set([...chosenMetrics(names), ...SUPPORT])];
    const answers = await Promise.all(jobs.map((job) => api(`/v1/jobs/${job.id}/metrics`, {
      query: { max_points: MAX_POINTS, names: wanted.join(","), times: true },
    })));
    if (stopped) return;
    runs = jobs.map((job, i) => {
      const byName = new Map(answers[i].series.map((s) => [s.name, s]));
      return { job, byName, tokensPerStep: tokensPerStep(byName), t0: startTime(answers[i].series) };
    });
    const scores = await latestScoresOf(jobs.map((job) => job.id));
    if (stopped) return;
    renderPicker(names);
    tableBox.replaceChildren(diffTable(runs, scores));
    await render();
    root.dataset.loaded = "true";
    if (jobs.every((job) => TERMINAL.has(job.state))) stop(); // nothing more will come
  }

  const stop = poll(load, REFRESH_MS);
  root.append(
    h("h1", {}, "Compare"),
    h("div", { class: "toolbar" }, h("label", { for: "compare-ids" }, "jobs"), idsInput, apply,
      runSearch, runOptions,
      h("label", { for: "compare-x" }, "x axis"), xSel,
      h("label", { for: "compare-smooth" }, "smoothing"), smooth, smoothOut,
      h("label", {}, log, " log scale")),
    metricsBox, note, charts,
    h("h2", {}, "Runs"), tableBox);
  return () => { stopped = true; stop(); for (const node of chartNodes.values()) purge(node); };
}
