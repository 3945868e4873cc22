// Compare: one metric of several jobs overlaid on one chart.

import { api } from "./api.js";
import { lineChart, purge } from "./charts.js";
import { entrypointOf } from "./code.js";
import { h, poll, stateBadge } from "./util.js";

const REFRESH_MS = 2000;
const MAX_POINTS = 2000;

export function comparePage(root, query) {
  const ids = (query.get("ids") ?? "").split(",").map(Number).filter((n) => Number.isInteger(n) && n > 0);
  const idsInput = h("input", { id: "compare-ids", value: ids.join(","), placeholder: "job ids, e.g. 12,15" });
  const metricSel = h("select", { id: "compare-metric", "aria-label": "metric" });
  const wanted = query.get("metric") ?? "loss";
  const chart = h("div", { class: "panel chart", id: "compare-chart" });
  const legend = h("ul", { class: "timeline", id: "compare-jobs" });
  const apply = h("button", { type: "button", class: "primary", id: "compare-apply" }, "Compare");

  apply.addEventListener("click", () => {
    const params = new URLSearchParams({ ids: idsInput.value.replace(/\s+/g, ""), metric: metricSel.value || wanted });
    window.location.hash = `#/compare?${params}`;
  });
  metricSel.addEventListener("change", () => {
    const params = new URLSearchParams({ ids: ids.join(","), metric: metricSel.value });
    window.location.hash = `#/compare?${params}`;
  });

  async function load() {
    if (!ids.length) {
      chart.replaceChildren(h("p", { class: "muted" }, "Pick jobs on the Jobs page (cmp column) or type their ids."));
      return;
    }
    const results = await Promise.all(ids.map(async (id) => {
      const [job, metrics] = await Promise.all([
        api(`/v1/jobs/${id}`),
        api(`/v1/jobs/${id}/metrics`, { query: { max_points: MAX_POINTS } }),
      ]);
      return { job, series: metrics.series };
    }));
    const names = [...new Set(results.flatMap((r) => r.series.map((s) => s.name)))].sort();
    const metric = names.includes(wanted) ? wanted : (names[0] ?? wanted);
    if (metricSel.options.length !== names.length) {
      metricSel.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
    }
    metricSel.value = metric;
    const traces = results.map(({ job, series }) => {
      const s = series.find((x) => x.name === metric) ?? { steps: [], values: [] };
      const strategy = entrypointOf(job) ? "script" : (job.spec?.parallelism?.strategy ?? "");
      return { name: `#${job.id} ${job.name}${strategy ? ` (${strategy})` : ""}`, x: s.steps, y: s.values };
    });
    await lineChart(chart, traces, { title: metric });
    legend.replaceChildren(...results.map(({ job }) => h("li", {},
      h("a", { href: `#/jobs/${job.id}` }, `#${job.id} ${job.name}`), " ", stateBadge(job.state))));
    root.dataset.loaded = "true";
  }

  const stop = poll(load, REFRESH_MS);
  root.append(
    h("h1", {}, "Compare"),
    h("div", { class: "toolbar" }, h("label", { for: "compare-ids" }, "jobs"), idsInput,
      h("label", { for: "compare-metric" }, "metric"), metricSel, apply),
    chart, h("h2", {}, "Jobs"), h("div", { class: "panel" }, legend));
  return () => { stop(); purge(chart); };
}
