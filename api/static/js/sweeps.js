// Sweeps: the project's sweeps (#/sweeps) and one sweep (#/sweeps/7): its best trial (with its
// job, checkpoint and export), the metric of every trial against step on one chart (pruned
// trials faded), a parallel-coordinates view of the values each trial drew against its metric,
// and the trials table. "Compare top k" opens Compare with the best trials' jobs.

import { api } from "./api.js";
import { COLORS, lineChart, plotlyReady, purge } from "./charts.js";
import { TERMINAL, fmtNumber, fmtTime, h, poll, showError, stateBadge } from "./util.js";

const REFRESH_MS = 3000;
const TOP_K = 4;
const MAX_POINTS = 500;
const ENDED = new Set(["succeeded", "failed", "cancelled", "pruned"]);

function trialCounts(sweep) {
  const ended = Object.entries(sweep.trials).filter(([s]) => s !== "running")
    .reduce((n, [, k]) => n + k, 0);
  return `${ended}/${sweep.max_trials} ended · ${sweep.trials.running ?? 0} running`
    + (sweep.trials.pruned ? ` · ${sweep.trials.pruned} pruned` : "");
}

export function sweepsPage(root) {
  const body = h("tbody");
  const table = h("table", { id: "sweeps-table" },
    h("thead", {}, h("tr", {}, ["id", "name", "state", "trials", "metric", "best", "created"]
      .map((c) => h("th", {}, c)))), body);
  root.append(h("h1", {}, "Sweeps"),
    h("p", { class: "muted" }, "Start one with `torchyard sweep submit sweep.yaml` or POST /v1/sweeps."),
    h("div", { class: "table-wrap panel" }, table));
  return poll(async () => {
    const { items } = await api("/v1/sweeps", { query: { limit: 200 } });
    body.replaceChildren(...(items.length ? items.map((s) => h("tr", { dataset: { sweep: s.id } },
      h("td", {}, h("a", { href: `#/sweeps/${s.id}` }, `#${s.id}`)),
      h("td", {}, s.name),
      h("td", {}, stateBadge(s.state)),
      h("td", {}, trialCounts(s)),
      h("td", {}, `${s.spec.metric} (${s.spec.direction === "maximize" ? "max" : "min"})`),
      h("td", { class: "num" }, s.best ? fmtNumber(s.best.value) : "–"),
      h("td", {}, fmtTime(s.created_at)))) : [h("tr", {}, h("td", { colspan: 7, class: "muted" }, "no sweeps yet"))]));
    root.dataset.loaded = "true";
  }, REFRESH_MS);
}

function paramText(value) {
  return typeof value === "number" ? fmtNumber(value) : String(value ?? "–");
}

function ranked(sweep, trials) {
  const sign = sweep.spec.direction === "maximize" ? -1 : 1;
  return trials.filter((t) => t.state === "succeeded" && t.value !== null)
    .sort((a, b) => sign * (a.value - b.value));
}

function bestCard(sweep, trials) {
  const best = sweep.best;
  if (!best) return h("section", { class: "panel", id: "sweep-best" }, h("h2", {}, "Best trial"),
    h("p", { class: "muted" }, "No trial has completed yet."));
  const top = ranked(sweep, trials).slice(0, TOP_K).map((t) => t.job_id).filter(Boolean);
  const metric = sweep.spec.metric;
  return h("section", { class: "panel", id: "sweep-best" },
    h("h2", {}, `Best trial: #${best.number}`),
    h("dl", { class: "kv" },
      h("dt", {}, metric), h("dd", { id: "sweep-best-value" }, fmtNumber(best.value)),
      h("dt", {}, "job"), h("dd", {}, best.job_id
        ? h("a", { href: `#/jobs/${best.job_id}`, id: "sweep-best-job" }, `#${best.job_id}`) : "–"),
      h("dt", {}, "checkpoint"), h("dd", {}, best.checkpoint_id
        ? h("a", { id: "sweep-best-checkpoint", href: `#/jobs/${best.job_id}?checkpoint=${best.checkpoint_id}` },
          `#${best.checkpoint_id} (step ${best.checkpoint_step})`) : "none kept"),
      ...Object.entries(best.params).flatMap(([path, value]) => [h("dt", {}, path), h("dd", {}, paramText(value))])),
    h("div", { class: "toolbar" },
      // A LoRA/QLoRA, Hugging Face or script trial's checkpoint is refused by the export (409):
      // the API says why, and what the run wrote instead, as the job page does.
      best.checkpoint_id && best.export_refused
        ? h("span", { id: "sweep-export-refused", class: "muted" }, `No export: ${best.export_refused}`) : null,
      best.checkpoint_id && !best.export_refused ? h("button", { type: "button", id: "sweep-export", onclick: async (event) => {
        event.target.disabled = true;
        try {
          const exp = await api(`/v1/jobs/${best.job_id}/checkpoints/${best.checkpoint_id}/export`, { method: "POST" });
          event.target.textContent = `Export ${exp.state}`;
        } catch (err) { showError(err); event.target.disabled = false; }
      } }, "Export") : null,
      top.length > 1 ? h("a", { id: "sweep-compare",
        href: `#/compare?ids=${top.join(",")}&metrics=${encodeURIComponent(metric)}` },
      h("button", { type: "button", class: "primary" }, `Compare top ${top.length}`)) : null));
}

function trialsTable(sweep, trials) {
  const paths = Object.keys(sweep.spec.space);
  return h("table", { id: "sweep-trials" },
    h("thead", {}, h("tr", {}, h("th", {}, "trial"), h("th", {}, "state"),
      paths.map((p) => h("th", {}, p)), h("th", {}, sweep.spec.metric), h("th", {}, "step"),
      h("th", {}, "job"), h("th", {}, "pruned at"), h("th", {}, "note"))),
    h("tbody", {}, trials.map((t) => h("tr", { dataset: { trial: t.number, state: t.state } },
      h("td", { class: "num" }, String(t.number)),
      h("td", {}, stateBadge(t.state)),
      paths.map((p) => h("td", { class: "num" }, paramText(t.params[p]))),
      h("td", { class: "num" }, t.value === null ? "–" : fmtNumber(t.value)),
      h("td", { class: "num" }, t.current_step === null ? "–" : String(t.current_step)),
      h("td", {}, t.job_id ? h("a", { href: `#/jobs/${t.job_id}` }, `#${t.job_id}`) : "–"),
      h("td", {}, t.pruned_step === null ? "–"
        : `step ${t.pruned_step}${t.pruned_rung === null ? "" : ` (rung ${t.pruned_rung})`}`),
      h("td", { class: "muted" }, t.error ?? "")))));
}

/** Every trial's metric against step: one line per trial, pruned ones faded, the best bold. */
async function metricChart(node, sweep, trials) {
  const metric = sweep.spec.metric;
  const withJobs = trials.filter((t) => t.job_id);
  const answers = await Promise.all(withJobs.map((t) => api(`/v1/jobs/${t.job_id}/metrics`, {
    query: { names: metric, max_points: MAX_POINTS },
  })));
  const traces = withJobs.map((t, i) => {
    const series = answers[i].series.find((s) => s.name === metric) ?? { steps: [], values: [] };
    const best = sweep.best?.number === t.number;
    return {
      name: `#${t.number}`, x: series.steps, y: series.values.map(Number),
      color: COLORS[t.number % COLORS.length],
      opacity: t.state === "pruned" ? 0.3 : best ? 1 : 0.8,
      meta: { trial: t.number, state: t.state },
    };
  });
  await lineChart(node, traces, { title: `${metric} of every trial` });
}

/** Parallel coordinates from Plotly's basic bundle: one axis per searched path (log where the
 * space is log-uniform) and the metric last, each scaled to [0, 1]; a line per ended trial. */
async function parallelChart(node, sweep, trials) {
  const Plotly = await plotlyReady();
  const paths = Object.keys(sweep.spec.space);
  const axes = [...paths, sweep.spec.metric];
  const scored = trials.filter((t) => t.value !== null);
  const raw = (t, axis) => (axis === sweep.spec.metric ? t.value : t.params[axis]);
  const ends = []; // each axis's [bottom, top] label
  const scale = axes.map((axis) => {
    const dim = sweep.spec.space[axis];
    const values = scored.map((t) => raw(t, axis));
    if (dim?.choice && !values.every((v) => typeof v === "number")) {
      const choices = dim.choice.map(String);
      ends.push([choices[0], choices[choices.length - 1]]);
      return (v) => (choices.length > 1 ? choices.indexOf(String(v)) / (choices.length - 1) : 0.5);
    }
    const f = dim?.log_uniform ? Math.log10 : (v) => v;
    const lo = Math.min(...values.map(f));
    const hi = Math.max(...values.map(f));
    ends.push([paramText(Math.min(...values)), paramText(Math.max(...values))]);
    return (v) => (hi > lo ? (f(v) - lo) / (hi - lo) : 0.5);
  });
  const css = getComputedStyle(document.documentElement);
  const fg = css.getPropertyValue("--fg").trim();
  const grid = css.getPropertyValue("--grid").trim();
  const data = scored.map((t) => ({
    type: "scatter", mode: "lines+markers", name: `#${t.number}`,
    x: axes, y: axes.map((axis, k) => scale[k](raw(t, axis))),
    customdata: axes.map((axis) => paramText(raw(t, axis))),
    hovertemplate: `#${t.number} %{x}: %{customdata}<extra></extra>`,
    opacity: t.state === "pruned" ? 0.3 : 0.9,
    line: { width: sweep.best?.number === t.number ? 3 : 1.5, color: COLORS[t.number % COLORS.length] },
    meta: { trial: t.number },
  }));
  const layout = {
    title: { text: "values drawn vs the metric (each axis scaled to its range)", font: { size: 13 }, x: 0.02, xanchor: "left" },
    margin: { l: 40, r: 12, t: 32, b: 36 }, height: 240,
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: fg, size: 11 },
    xaxis: { type: "category", gridcolor: grid }, yaxis: { range: [-0.05, 1.05], gridcolor: grid, showticklabels: false },
    showlegend: false,
    annotations: scored.length ? axes.flatMap((axis, k) => [0, 1].map((y) => ({
      x: axis, y, text: ends[k][y], showarrow: false, xanchor: "left", xshift: 4,
      font: { size: 10, color: fg },
    }))) : [],
  };
  await Plotly.react(node, data, layout, { displaylogo: false, responsive: true });
}

export function sweepPage(root, sweepId) {
  const head = h("div");
  const best = h("div");
  const chart = h("div", { class: "chart", id: "sweep-metric-chart" });
  const parallel = h("div", { class: "chart", id: "sweep-parallel" });
  const table = h("div", { class: "table-wrap panel" });
  const cancel = h("button", { type: "button", class: "danger", id: "sweep-cancel", onclick: async () => {
    try { await api(`/v1/sweeps/${sweepId}/cancel`, { method: "POST" }); stop.now(); } catch (err) { showError(err); }
  } }, "Cancel sweep");
  root.append(head, best, h("div", { class: "grid2" }, h("section", { class: "panel" }, chart),
    h("section", { class: "panel" }, parallel)), table);
  let stopped = false;
  const stop = poll(async () => {
    const [sweep, { items: trials }] = await Promise.all([
      api(`/v1/sweeps/${sweepId}`), api(`/v1/sweeps/${sweepId}/trials`)]);
    if (stopped) return;
    head.replaceChildren(h("h1", {}, `Sweep #${sweep.id} ${sweep.name} `, stateBadge(sweep.state)),
      h("p", { class: "muted", id: "sweep-summary" },
        `${sweep.spec.searcher} search, ${sweep.spec.pruner.kind} pruner · ${trialCounts(sweep)} · `
        + `${sweep.spec.direction} ${sweep.spec.metric}`
        + (sweep.error ? ` · ${sweep.error}` : "")),
      ENDED.has(sweep.state) ? h("span") : cancel);
    best.replaceChildren(bestCard(sweep, trials));
    table.replaceChildren(trialsTable(sweep, trials));
    await metricChart(chart, sweep, trials);
    await parallelChart(parallel, sweep, trials);
    root.dataset.loaded = "true";
    if (ENDED.has(sweep.state) && trials.every((t) => !t.job_state || TERMINAL.has(t.job_state))) stop();
  }, REFRESH_MS);
  return () => { stopped = true; stop(); purge(chart); purge(parallel); };
}
