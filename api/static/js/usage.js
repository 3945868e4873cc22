// Usage: the project's slot-hours, CPU-hours and cost per day, pool or job (GET /v1/usage),
// a bar chart of cost per day (of slot-hours when no pool used has a price, saying so), and
// the same report as CSV. Default window: this month (UTC).

import { api, download } from "./api.js";
import { barChart, purge } from "./charts.js";
import { fmtNumber, h, showError } from "./util.js";

const KEYS = { day: ["day"], pool: ["pool"], job: ["job_id", "job_name", "pool"] };
const TITLES = { day: "Day", pool: "Pool", job_id: "Job", job_name: "Name" };

function monthStart(offset = 0) {
  const now = new Date();
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + offset, 1))
    .toISOString().slice(0, 10);
}

function hours(seconds) {
  return (seconds / 3600).toFixed(2);
}

function keyCell(key, row) {
  const value = row[key];
  if (key === "job_id") return h("td", { class: "num" }, h("a", { href: `#/jobs/${value}` }, String(value)));
  return h("td", {}, value ?? "–");
}

function reportTable(report) {
  const keys = KEYS[report.group_by];
  const totals = (row) => [
    h("td", { class: "num" }, hours(row.slot_seconds)),
    h("td", { class: "num" }, hours(row.cpu_seconds)),
    h("td", { class: "num" }, row.cost.toFixed(2)),
  ];
  const head = h("tr", {}, keys.map((k) => h("th", {}, TITLES[k])),
    ["Slot-hours", "CPU-hours", `Cost (${report.currency})`].map((c) => h("th", { class: "num" }, c)));
  const rows = report.rows.map((row) => h("tr", { dataset: { key: String(row[keys[0]]) } },
    keys.map((k) => keyCell(k, row)), totals(row)));
  if (!rows.length) {
    rows.push(h("tr", {}, h("td", { colspan: keys.length + 3, class: "muted" }, "No usage in this window.")));
  }
  const total = h("tr", { class: "total" }, h("th", { colspan: keys.length }, "Total"), totals(report.total));
  return h("table", { id: "usage-table" }, h("thead", {}, head), h("tbody", {}, rows), h("tfoot", {}, total));
}

/** What the page says of pools used without a slot-hour price (as the CLI says it). */
export function noPriceNote(pools) {
  return `No price set for pool${pools.length > 1 ? "s" : ""} ${pools.join(", ")} `
    + "(TORCHYARD_SLOT_PRICES): their slot-hours cost 0.";
}

export function usagePage(root) {
  let stopped = false;
  const since = h("input", { id: "usage-since", type: "date", value: monthStart() });
  const until = h("input", { id: "usage-until", type: "date", value: monthStart(1) });
  const by = h("select", { id: "usage-by" },
    ["day", "pool", "job"].map((v) => h("option", { value: v }, `per ${v}`)));
  const summary = h("span", { class: "muted", id: "usage-summary" });
  const priceNote = h("p", { class: "warning", id: "usage-price-note", hidden: true });
  const chart = h("div", { id: "usage-chart", class: "chart" });
  const wrap = h("div", { class: "table-wrap" });
  const query = () => ({ since: since.value, until: until.value });

  async function load() {
    try {
      const [report, days] = await Promise.all([
        api("/v1/usage", { query: { ...query(), group_by: by.value } }),
        api("/v1/usage", { query: { ...query(), group_by: "day" } }),
      ]);
      if (stopped) return;
      wrap.replaceChildren(reportTable(report));
      summary.textContent = `${hours(report.total.slot_seconds)} slot-hours · `
        + `${report.total.cost.toFixed(2)} ${report.currency}`;
      const unpriced = days.unpriced_pools ?? [];
      priceNote.hidden = !unpriced.length;
      priceNote.textContent = unpriced.length ? noPriceNote(unpriced) : "";
      // Nothing priced: a cost chart would be all zeros, so chart what was used.
      const byCost = days.total.cost > 0 || !days.rows.length;
      await barChart(chart, days.rows.map((r) => r.day),
        days.rows.map((r) => (byCost ? r.cost : r.slot_seconds / 3600)), byCost
          ? { title: `Cost per day (${days.currency})`, yTitle: days.currency }
          : { title: "Slot-hours per day", yTitle: "slot-hours" });
      chart.dataset.series = byCost ? "cost" : "slot_hours";
      root.dataset.loaded = "true";
    } catch (err) {
      showError(err);
    }
  }

  const csv = h("button", { type: "button", id: "usage-csv", onclick: () => {
    const params = new URLSearchParams({ ...query(), group_by: by.value, format: "csv" });
    download(`/v1/usage?${params}`, `usage-${by.value}.csv`).catch(showError);
  } }, "Download CSV");
  for (const input of [since, until, by]) input.addEventListener("change", load);
  root.append(
    h("h1", {}, "Usage"),
    h("div", { class: "toolbar" },
      h("label", {}, "From ", since), h("label", {}, "to ", until), by, summary,
      h("span", { class: "spacer" }), csv),
    h("p", { class: "muted", id: "usage-explain" }, "Slot-hours: devices (GPUs, or CPU slots) "
      + "× hours held by a job's nodes; a running job counts up to now. Days are UTC."),
    priceNote,
    h("div", { class: "panel" }, chart),
    wrap);
  load();
  return () => { stopped = true; purge(chart); };
}
