// Job detail: live metric charts, events, log tail, checkpoints, the spec, and control buttons.
// An eval job's (`evaluate`) leads with its scores and the checkpoint they are of; it trains
// nothing, so it has no checkpoints and no "trained" row. A series of one point (an eval job's
// every series) is a number beside the charts, not a chart of its own.

import { api, capabilities, download, pageAfter } from "./api.js";
import { COLORS, lineChart, onZoom, purge } from "./charts.js";
import { codeCard, entrypointOf, scriptBadge } from "./code.js";
import {
  SCHEDULES, X_AXES, ema, plotValue, startTime, tokensPerStep, xValues,
} from "./compare_data.js";
import { evalBadge, evalSourceOf, evalsCard, sourceNode } from "./evals.js";
import { failureView } from "./failure.js";
import { follow } from "./stream.js";
import { summaryCard } from "./summary.js";
import {
  TERMINAL, etaSeconds, queueText, fmtBytes, fmtDuration, fmtNumber, fmtRate, fmtSeconds, fmtTime,
  h, poll, copyButton, ownPrefixDropped, prose, showError, stateBadge, toYaml, trainedText,
} from "./util.js";

const REFRESH_MS = 1000; // polling, while no event stream is open
const STREAM_REFRESH_MS = 5000; // a safety net while the stream pushes
const NUDGE_MS = 300; // stream messages within this window cause one refresh
const MAX_POINTS = 2000; // per series; the API downsamples (min/max buckets) beyond that
const MAX_LOG_LINES = 2000;
const EXPORT_POLL_MS = 1000; // while an export is pending or running
const CKPT_COLUMNS = 5; // step, attempt, size, created, export; the uri on a row of its own
// Charts in this order; a series not named here gets a chart of its own after them.
const CHARTS = [
  { id: "loss", title: "loss", series: ["loss", "eval_loss"] },
  { id: "lr", title: "learning rate", series: ["lr"] },
  { id: "grad_norm", title: "grad norm", series: ["grad_norm"] },
  { id: "tokens_per_second", title: "tokens / s", series: ["tokens_per_second"], yFormat: ".3s", yHover: fmtRate },
  { id: "step_time_s", title: "step time", series: ["step_time_s"], ySuffix: " s", yHover: fmtSeconds },
];

// The worker's `sys/<quantity>/<rank|node|gpu>` series: one chart per quantity, one trace each.
const SYSTEM = {
  cpu_percent: { title: "CPU % (100 = one core)" },
  rss_bytes: { title: "memory (RSS)", yFormat: ".3s", ySuffix: "B", yHover: fmtBytes },
  gpu_util_percent: { title: "GPU utilisation %" },
  gpu_memory_bytes: { title: "GPU memory used", yFormat: ".3s", ySuffix: "B", yHover: fmtBytes },
  gpu_power_watts: { title: "GPU power (W)" },
};
const isSystem = (name) => name.startsWith("sys/");

// A GRPO run's charts lead its page, in this order (`reward/<grader>` series: one chart);
// its `eval_loss` is -eval_reward, so its loss chart shows the training loss alone.
const GRPO_CHARTS = [
  { id: "reward", title: "reward (mean over completions; held out: greedy)", series: ["reward", "eval_reward"] },
  { id: "reward_graders", title: "reward per grader", prefix: ["reward/"] },
  { id: "grader_failures", title: "grader errors and timeouts (so far)",
    prefix: ["grader_errors/", "grader_timeouts/"] },
  { id: "kl", title: "KL to the reference", series: ["kl"] },
  { id: "clip_ratio", title: "clipped tokens", series: ["clip_ratio/low", "clip_ratio/high", "clip_ratio/region"] },
  { id: "entropy", title: "entropy (nats / token)", series: ["entropy"] },
  { id: "completion_length", title: "completion length (tokens)", series: ["completion_length"] },
  { id: "frac_reward_zero_std", title: "groups without reward spread", series: ["frac_reward_zero_std"] },
  { id: "reward_std", title: "reward std", series: ["reward_std"] },
];

/** The charts of the trainer's series `names`. A series `<name>/<stat>` (the step time's
 * `/max`, `/median` across ranks) joins `<name>`'s chart, and only when the job has more than
 * one rank (`world`): with one they repeat it. A GRPO run (it reports `reward`) shows its
 * reward charts first (`GRPO_CHARTS`). */
function chartsFor(names, world) {
  const grpo = names.includes("reward");
  const lead = grpo ? GRPO_CHARTS.map(({ prefix, ...c }) => (prefix
    ? { ...c, series: names.filter((n) => prefix.some((p) => n.startsWith(p))).sort() } : c)) : [];
  const base = grpo ? CHARTS.map((c) => (c.id === "loss" ? { ...c, series: ["loss"] } : c)) : CHARTS;
  const known = new Set([...lead, ...base].flatMap((c) => c.series));
  if (grpo) known.add("eval_loss");
  const baseOf = (n) => n.split("/")[0];
  const perRank = (n) => n.includes("/") && known.has(baseOf(n)) && !known.has(n);
  const extra = names.filter((n) => !known.has(n) && !isSystem(n) && !perRank(n)).sort()
    .map((n) => ({ id: n.replace(/[^A-Za-z0-9_-]/g, "_"), title: n, series: [n] }));
  const withStats = [...lead, ...base].map((c) => ({ ...c, series: [...c.series,
    ...(world > 1 ? names.filter((n) => perRank(n) && c.series.includes(baseOf(n))).sort() : [])] }));
  return [...withStats.filter((c) => c.series.some((s) => names.includes(s))), ...extra];
}

function systemChartsFor(names) {
  const byQuantity = new Map();
  for (const name of names.filter(isSystem).sort((a, b) => a.localeCompare(b, "en", { numeric: true }))) {
    const quantity = name.split("/")[1];
    if (!byQuantity.has(quantity)) byQuantity.set(quantity, []);
    byQuantity.get(quantity).push(name);
  }
  const order = Object.keys(SYSTEM); // known quantities in this order, then the others
  const place = (q) => (order.includes(q) ? order.indexOf(q) : order.length);
  return [...byQuantity].sort(([a], [b]) => place(a) - place(b)).map(([quantity, series]) => ({
    id: `sys-${quantity.replace(/[^A-Za-z0-9_-]/g, "_")}`, title: quantity, ...SYSTEM[quantity],
    series, label: (n) => n.split("/").slice(2).join("/"),
  }));
}

/**
 * Why the API refuses to export this job's checkpoints (409: only the built-in GPT's full
 * weights convert to safetensors), or null when it can.
 */
function notExportable(job) {
  if (entrypointOf(job)) return "a script's checkpoints are its own files (in the server's storage at their uri), not a model to export";
  const spec = job.spec ?? {};
  if (spec.lora || spec.qlora || spec.model?.kind === "hf") return "LoRA/QLoRA and Hugging Face runs write their own exports at the end";
  return null;
}

/** "120 / 600 · ETA 3m"; a script job's end is its own: "step 120" ("–" before the first). */
function progressText(job) {
  if (!job.max_steps) return job.current_step === null || job.current_step === undefined ? "–" : `step ${job.current_step}`;
  const eta = etaSeconds(job);
  return `${job.current_step ?? 0} / ${job.max_steps}${eta !== null ? ` · ETA ${fmtDuration(eta)}` : ""}`;
}

/** Why a trial's job ended `pruned`: its sweep (linked) and where its pruner stopped it
 * ("pruned by sweep 3 at step 20, rung 1", the job's `error`). */
function prunedNode(job) {
  const sweep = job.labels?.sweep;
  const trial = job.labels?.trial;
  const why = job.error ?? "pruned by its sweep";
  if (!sweep) return why;
  return h("span", {},
    h("a", { href: `#/sweeps/${sweep}`, id: "pruned-by" }, `sweep ${sweep}`),
    trial !== undefined ? ` · trial ${trial} · ` : " · ", why.replace(/^pruned by sweep \d+ /, ""));
}

/** Series of one point, as name and value: a number, not a chart (bytes as bytes). */
function valueRows(byName, names) {
  return names.map((n) => {
    const v = byName.get(n).values[0];
    const text = n.includes("_bytes") && typeof v === "number" ? fmtBytes(v) : fmtNumber(v);
    return [n, text];
  });
}

/** The evaluation names of an eval job's spec: its `<name>.<metric>` series are its scores. */
function evalNames(job) {
  return new Set((job?.spec?.evaluate?.evaluations ?? [])
    .map((e) => (typeof e === "string" ? e : e.name ?? e.kind)));
}

function eventText(e) {
  if (e.kind === "state") return `${e.state_from ?? "–"} → ${e.state_to}${e.message ? `: ${e.message}` : ""}`;
  if (e.kind === "checkpoint") return `checkpoint at step ${e.data?.step ?? "?"}`;
  return e.message || e.kind;
}

// `query`: `checkpoint=<id>` opens the page on that checkpoint's row, marked (a sweep's best).
export function detailPage(root, jobId, query = new URLSearchParams()) {
  const title = h("span", { id: "job-title" }, `Job #${jobId}`);
  const badge = h("span", { id: "job-state" });
  const cancel = h("button", { id: "cancel-job", class: "danger", type: "button" }, "Cancel");
  // Shown only when the API offers them (its OpenAPI document) and the state allows them.
  const actions = {
    pause: { label: "Pause", when: ["queued", "starting", "running"] },
    resume: { label: "Resume", when: ["paused"] },
    retry: { label: "Retry", when: ["failed", "cancelled"] },
  };
  for (const [name, action] of Object.entries(actions)) {
    action.button = h("button", { id: `${name}-job`, type: "button", hidden: true }, action.label);
    action.button.addEventListener("click", () => act(name, action.button));
  }
  let offered = [];
  capabilities().then((c) => { offered = c.actions; if (job) renderJob(); }).catch(() => {});
  const clone = h("a", { href: `#/submit?from=${jobId}` },
    h("button", { type: "button" }, "Clone and edit"));
  const compareLink = h("a", { href: `#/compare?ids=${jobId}` },
    h("button", { type: "button" }, "Compare…"));
  // A failed job's page starts with why it failed; a restarted one with its last failure.
  const failureSlot = h("div", { id: "failure-slot" });
  let failureShown = "";
  // A job whose stored spec no longer reads as written (an older release's, or edited by hand).
  const specProblems = h("section", { id: "spec-problems", class: "spec-problems", hidden: true,
    "aria-label": "spec needs attention" });
  const summary = h("dl", { class: "kv", id: "job-summary" });
  // Losses, tokens, throughput, MFU, the sample, hyperparameters; labels and note to edit.
  const card = summaryCard(jobId, (updated) => { job = updated; renderJob(); });
  const codeSlot = h("div", { id: "code-slot" }); // a script job's "Code" card
  const evals = evalsCard(jobId); // its evaluations, or an eval job's results
  const kindSlot = h("span", { id: "job-kind" });
  const charts = h("div", { class: "grid2", id: "charts" });
  // Series of one point so far: numbers, not charts (an eval job's are all of one step).
  const values = h("dl", { class: "kv", id: "metric-values" });
  const valuesBox = h("div", { class: "panel", id: "metric-values-box", hidden: true }, values);
  const leadSlot = h("div", { id: "lead-slot" }); // an eval job's scores, above its metrics
  // Smoothing and the x axis, as in Compare (TensorBoard's EMA; schedules never smoothed).
  const smoothing = h("input", { id: "job-smoothing", type: "range", min: 0, max: 0.99,
    step: 0.01, value: 0, "aria-label": "smoothing" });
  const smoothingValue = h("span", { class: "muted", id: "job-smoothing-value" }, "0");
  const xAxisSel = h("select", { id: "job-x-axis", "aria-label": "x axis" },
    Object.entries(X_AXES).map(([v, a]) => h("option", { value: v }, a.title)));
  const axisNote = h("span", { class: "muted", id: "job-x-note" });
  const toolbar = h("div", { class: "toolbar", id: "metrics-toolbar" },
    h("label", {}, "smoothing ", smoothing, " ", smoothingValue),
    h("label", {}, "x axis ", xAxisSel), axisNote);
  const redraw = () => {
    smoothingValue.textContent = Number(smoothing.value).toFixed(2);
    zoom = null;
    loadMetrics().catch(showError);
  };
  smoothing.addEventListener("input", redraw);
  xAxisSel.addEventListener("change", redraw);
  const systemHeading = h("h2", { id: "system-heading", hidden: true }, "System");
  const systemCharts = h("div", { class: "grid2", id: "system-charts" });
  const chartNodes = new Map();
  const timeline = h("ul", { class: "timeline", id: "events" });
  const ckptBody = h("tbody", { id: "checkpoints" });
  const loraSlot = h("div", { id: "lora-exports" }); // a LoRA run's adapter and merged model
  const ckptSection = h("section", { id: "checkpoints-section" }, h("h2", {}, "Checkpoints"),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "step"), h("th", { class: "num" }, "attempt"),
        h("th", { class: "num" }, "size"), h("th", {}, "created"), h("th", {}, "export"))),
      ckptBody)), loraSlot);
  const rankSel = h("select", { id: "log-rank", "aria-label": "rank" },
    h("option", { value: "" }, "all ranks"), h("option", { value: "-1" }, "launcher (-1)"));
  const search = h("input", { id: "log-search", type: "search", placeholder: "search logs…" });
  const logBox = h("div", { class: "log", id: "logs" });
  const specBox = h("pre", { id: "spec" });
  const specFormat = h("select", { id: "spec-format", "aria-label": "spec format" },
    h("option", { value: "yaml" }, "YAML"), h("option", { value: "json" }, "JSON"));
  const showSpec = () => {
    specBox.textContent = specFormat.value === "json"
      ? JSON.stringify(job.spec, null, 2) : toYaml(job.spec).trimStart();
  };
  specFormat.addEventListener("change", showSpec);
  let job = null;
  let eventsAfter;
  let logsAfter;
  let logLines = [];
  let rankChosen = false; // the log filter was set (by the user, or to a failed job's rank)
  let finalPass = false;

  async function act(name, button) {
    button.disabled = true;
    try {
      job = await api(`/v1/jobs/${jobId}/${name}`, { method: "POST" });
      finalPass = false;
      renderJob();
      if (ended) { // a retried or resumed job lives again: follow it again
        ended = false;
        stopStream?.();
        stopStream = null;
        stop = poll(tick, interval);
      } else {
        stop.now();
      }
    } catch (err) {
      showError(err);
      button.disabled = false;
    }
  }
  cancel.addEventListener("click", () => act("cancel", cancel));

  function renderJob() {
    title.textContent = `${job.name} · #${job.id}`;
    badge.replaceChildren(stateBadge(job.state, job.state === "pruned" ? job.error : null));
    cancel.disabled = TERMINAL.has(job.state) || job.state === "cancelling";
    for (const [name, action] of Object.entries(actions)) {
      action.button.hidden = !offered.includes(name) || !action.when.includes(job.state);
      action.button.disabled = false;
    }
    // A user error fails the same way when retried: the page leads with Clone and edit.
    const userError = job.state === "failed" && job.failure?.failure_class === "user_error";
    actions.retry.button.classList.toggle("subtle", userError);
    actions.retry.button.title = userError
      ? "A user error fails the same way when retried: change the spec, data or code first" : "";
    clone.firstElementChild.classList.toggle("primary", userError);
    const res = job.spec?.resources ?? {};
    const script = Boolean(entrypointOf(job));
    if (!codeSlot.childElementCount && script) {
      codeSlot.replaceChildren(codeCard(job));
      kindSlot.replaceChildren(scriptBadge());
    }
    const source = evalSourceOf(job);
    if (source && !kindSlot.childElementCount) {
      kindSlot.replaceChildren(evalBadge());
      leadSlot.replaceChildren(evals.node); // the scores lead the page
      ckptSection.remove(); // an eval job writes none
    }
    let kindRows = [["strategy", job.spec?.parallelism?.strategy ?? "–"]];
    if (script) kindRows = [["kind", "script"]];
    if (source) kindRows = [["kind", "eval"], ["source", sourceNode(source, job.current_step)]];
    const served = job.spec?.session; // a training client of a Tinker-compatible session
    if (served) kindRows = [["kind", "session"], ["session", h("a", { href: `#/sessions/${served.session_id}`, id: "job-session" }, served.session_id)],
      ["training client", `${served.model_id} · ${served.base_model} · LoRA rank ${served.lora_rank}`]];
    const rows = [
      ["state", job.state], ["attempt", job.attempt],
      ...(source ? [] : [["progress", progressText(job)]]),
      ...kindRows,
      ["nodes × procs", `${res.nodes ?? 1} × ${res.procs_per_node ?? 1}`],
      ["pool", job.pool], ["created", fmtTime(job.created_at)],
      ["started", fmtTime(job.started_at)], [source ? "ran" : "trained", trainedText(job)],
      ["worker", job.worker ?? "–"],
    ];
    if (job.queue) rows.push(["queue", queueText(job)]);
    if (job.waiting_for) rows.push(["waiting for", h("span", {}, prose(job.waiting_for))]);
    if (job.exit_code !== null && job.exit_code !== undefined) rows.push(["exit code", job.exit_code]);
    // The failure card shows a failure's error (with its log tail); other errors stay here.
    if (job.state === "pruned") rows.push(["pruned", prunedNode(job)]);
    else if (job.error && !job.failure && job.state !== "failed") rows.push(["error", job.error]);
    if (job.restarts_used && !job.failure) rows.push(["restarts", job.retry_policy?.summary ?? job.restarts_used]);
    const used = job.usage;
    if (used?.slot_seconds) {
      const limit = job.spec?.limits?.max_cost;
      rows.push(["usage", `${(used.slot_seconds / 3600).toFixed(2)} slot-h · `
        + `${(used.cpu_seconds / 3600).toFixed(2)} CPU-h · cost ${used.cost.toFixed(2)}`
        + (limit ? ` of ${limit}` : "")]);
    }
    const datasetId = job.spec?.data?.dataset;
    if (datasetId) rows.push(["dataset", h("a", { href: `#/datasets/${datasetId}` }, datasetId)]);
    const shown = JSON.stringify([job.state, job.failure, job.error, job.retry_policy?.summary]);
    if (shown !== failureShown) { // re-rendered only on change: a selection in the tail survives
      failureShown = shown;
      const view = failureView(job, showRankLogs);
      failureSlot.replaceChildren(...(view ? [view] : []));
    }
    const problems = job.spec_problems ?? [];
    if (problems.length && specProblems.hidden) {
      specProblems.hidden = false;
      specProblems.replaceChildren(
        h("strong", {}, "Needs attention: "),
        "its stored spec no longer reads as written, so it will not be started. Clone and edit "
        + "it to submit it again with today's fields.",
        h("ul", {}, ...problems.map((p) => h("li", {}, p))));
    }
    summary.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k),
      h("dd", { dataset: { field: k } }, v instanceof Node ? v : String(v))]));
    if (!specBox.textContent) showSpec();
    card.job(job);
    const sel = rankSel.value;
    const world = (res.nodes ?? 1) * (res.procs_per_node ?? 1);
    if (rankSel.options.length !== world + 2) {
      rankSel.replaceChildren(h("option", { value: "" }, "all ranks"),
        h("option", { value: "-1" }, "launcher (-1)"),
        ...Array.from({ length: world }, (_, r) => h("option", { value: String(r) }, `rank ${r}`)));
      rankSel.value = sel;
    }
    // A failed job's logs open on the failing rank (its traceback last), not on all ranks,
    // whose end is torchrun's own error report; the user's choice is kept after that.
    const failedRank = job.failure?.rank;
    if (!rankChosen && job.state === "failed" && Number.isInteger(failedRank)) {
      rankChosen = true;
      showRankLogs(failedRank, false);
    }
  }

  // Zooming a chart's steps refetches every series for that range only, downsampled to
  // MAX_POINTS, so a 100k-step run shows full detail where you look; double-click resets.
  let zoom = null;
  async function loadMetrics() {
    const range = zoom;
    const axis = xAxisSel.value;
    const weight = Number(smoothing.value);
    const { series } = await api(`/v1/jobs/${jobId}/metrics`, {
      query: {
        max_points: MAX_POINTS,
        start: range ? Math.max(0, Math.floor(range[0])) : undefined,
        end: range ? Math.max(0, Math.ceil(range[1])) : undefined,
        times: axis === "time" ? true : undefined,
      },
    });
    if (range !== zoom || axis !== xAxisSel.value) return; // changed while this was on its way
    root.dataset.zoom = range ? `${Math.floor(range[0])}-${Math.ceil(range[1])}` : "";
    const byName = new Map(series.map((s) => [s.name, s]));
    const names = [...byName.keys()];
    const res = job?.spec?.resources ?? {};
    const world = (res.nodes ?? 1) * (res.procs_per_node ?? 1);
    const run = { byName, tokensPerStep: tokensPerStep(byName), t0: startTime(series) };
    // A chart whose every series has one point is numbers instead (an eval job's: all of one
    // step); one drawn already, or a zoomed range, stays a chart.
    const onePoint = (c) => !range && !chartNodes.has(c.id)
      && c.series.every((n) => (byName.get(n)?.values.length ?? 0) <= 1);
    const candidates = [...chartsFor(names, world).map((c) => [charts, c]),
      ...systemChartsFor(names).map((c) => [systemCharts, c])];
    const placed = candidates.filter(([, c]) => !onePoint(c));
    const scores = evalNames(job); // an eval job's scores lead the page in its Scores card
    const listed = candidates.filter(([, c]) => onePoint(c)).flatMap(([, c]) => c.series)
      .filter((n) => byName.has(n) && !(n.includes(".") && scores.has(n.split(".")[0])));
    values.replaceChildren(...valueRows(byName, listed).flatMap(([k, v]) => [h("dt", {}, k),
      h("dd", { dataset: { metric: k } }, v)]));
    valuesBox.hidden = !listed.length;
    // An x axis the run cannot give (no tokens per step, e.g. a script's own metrics): steps.
    const shownAxis = series.every((s) => xValues(run, s, axis) !== null) ? axis : "step";
    axisNote.textContent = shownAxis === axis ? "" : `(no ${X_AXES[axis].title} for this run: by step)`;
    root.dataset.xAxis = shownAxis;
    for (const [box, chart] of placed) {
      let node = chartNodes.get(chart.id);
      const fresh = !node;
      if (fresh) {
        node = h("div", { class: "panel chart", id: `chart-${chart.id}` });
        chartNodes.set(chart.id, node);
        box.append(node);
      }
      const smooth = weight > 0 && box === charts;
      const traces = chart.series.filter((n) => byName.has(n)).flatMap((n, i) => {
        const s = byName.get(n);
        const name = chart.label ? chart.label(n) : n;
        const x = xValues(run, s, shownAxis);
        const color = COLORS[i % COLORS.length];
        if (!smooth || SCHEDULES.has(n)) return [{ name, x, y: s.values, color }];
        const y = s.values.map(plotValue);
        return [{ name: `${name} (raw)`, x, y, color, opacity: 0.25, legend: false, hover: false },
          { name, x, y: ema(y, weight), color }];
      });
      if (!traces.length) continue; // nothing in the zoomed range
      await lineChart(node, traces, {
        title: chart.title, yFormat: chart.yFormat, ySuffix: chart.ySuffix, yHover: chart.yHover,
        xTitle: X_AXES[shownAxis].title, xFormat: X_AXES[shownAxis].format,
        xHover: X_AXES[shownAxis].hover,
      });
      // Zooming refetches a range of steps: on the step axis only.
      if (fresh) onZoom(node, (r) => { if (xAxisSel.value !== "step") return; zoom = r; loadMetrics().catch(showError); });
    }
    systemHeading.hidden = !systemCharts.childElementCount;
    toolbar.hidden = !charts.childElementCount; // smoothing and axes of no chart: none
    if (!series.length && !charts.childElementCount) {
      charts.replaceChildren(h("p", { class: "muted", id: "no-metrics" }, "No metrics reported yet."));
    } else {
      document.getElementById("no-metrics")?.remove();
    }
  }

  async function loadEvents() {
    const { items, last } = await pageAfter(`/v1/jobs/${jobId}/events`, { after: eventsAfter });
    eventsAfter = last;
    card.events(items);
    for (const e of items) {
      timeline.append(h("li", { dataset: { kind: e.kind } },
        h("span", { class: "when" }, fmtTime(e.created_at)),
        h("span", { class: `muted` }, `[${e.kind}${e.attempt > 1 ? ` attempt ${e.attempt}` : ""}] `),
        eventText(e)));
    }
    if (items.length) timeline.scrollTop = timeline.scrollHeight;
  }

  function renderLogs() {
    const needle = search.value.trim().toLowerCase();
    const shown = needle ? logLines.filter((l) => l.line.toLowerCase().includes(needle)) : logLines;
    const atBottom = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 4;
    logBox.replaceChildren(...shown.map((l) => {
      const text = ownPrefixDropped(l.rank, l.line);
      let body = [text];
      const at = needle ? text.toLowerCase().indexOf(needle) : -1;
      if (at >= 0) body = [text.slice(0, at), h("mark", {}, text.slice(at, at + needle.length)), text.slice(at + needle.length)];
      return h("div", { class: l.stream === "stderr" ? "stderr" : "", dataset: { rank: l.rank } },
        h("span", { class: "rank" }, `[${l.rank < 0 ? "launcher" : `rank ${l.rank}`}] `), ...body);
    }));
    if (!shown.length) logBox.append(h("span", { class: "muted" }, needle ? "No line matches." : "No log lines yet."));
    if (atBottom) logBox.scrollTop = logBox.scrollHeight;
  }

  // One page of logs at a time: two loads from the same cursor would show its lines twice (the
  // poll and a change of filter can both ask); a load from before a reset is dropped.
  let logsLoading = Promise.resolve();
  let logsEpoch = 0;
  function loadLogs() {
    logsLoading = logsLoading.then(loadLogsPage, loadLogsPage);
    return logsLoading;
  }
  function resetLogs() {
    logsEpoch += 1;
    logsAfter = undefined; logLines = []; logBox.replaceChildren();
    return loadLogs();
  }

  async function loadLogsPage() {
    const rank = rankSel.value;
    const epoch = logsEpoch;
    const { items, last } = await pageAfter(`/v1/jobs/${jobId}/logs`, {
      after: logsAfter, query: { rank: rank === "" ? undefined : rank }, limit: 5000,
    });
    if (epoch !== logsEpoch) return; // the filter changed while this page was in flight
    logsAfter = last;
    if (items.length || !logBox.childElementCount) {
      logLines = logLines.concat(items).slice(-MAX_LOG_LINES);
      renderLogs();
    }
  }

  // Checkpoints, each with its safetensors export: "Export" asks a worker for one (POST), the
  // state shows while it is made, "Download" fetches it with the key once ready.
  let exportTimer = null;
  let shownWanted = false; // scrolled to the checkpoint the URL names, once
  async function loadCheckpoints() {
    const { items } = await api(`/v1/jobs/${jobId}/checkpoints`);
    const wanted = query.get("checkpoint");
    ckptBody.replaceChildren(...items.flatMap((c) => [h("tr", {
      id: `checkpoint-${c.id}`, class: String(c.id) === wanted ? "chosen" : "", dataset: { step: c.step },
    },
      h("td", { class: "num" }, c.step), h("td", { class: "num" }, c.attempt),
      h("td", { class: "num" }, fmtBytes(c.size_bytes)), h("td", {}, fmtTime(c.created_at)),
      exportCell(c)), uriRow(c)]));
    if (!items.length) ckptBody.append(h("tr", {}, h("td", { colspan: CKPT_COLUMNS, class: "muted" }, "None yet.")));
    if (wanted && !shownWanted) {
      const row = ckptBody.querySelector(`#checkpoint-${CSS.escape(wanted)}`);
      if (row) { shownWanted = true; row.scrollIntoView({ block: "center" }); }
    }
    if (job?.spec?.lora || job?.spec?.qlora) await loadLora();
    // The page stops polling once the job has ended; an export in the making is still followed.
    clearTimeout(exportTimer);
    if (items.some((c) => ["pending", "running"].includes(c.export?.state))) {
      exportTimer = setTimeout(() => loadCheckpoints().catch(showError), EXPORT_POLL_MS);
    }
  }

  /** A checkpoint's place, on its own line under the checkpoint's row (issue 45: as a column
   * it was cut to "jc" and its Copy pushed out of the half-width card at 1366 px): whole,
   * wrapped where it must, the server's full path in its tooltip and its Copy button. */
  function uriRow(c) {
    const where = c.server_uri ?? c.uri;
    const code = h("code", {}, c.uri);
    return h("tr", { class: "where", dataset: { uriOf: c.step } },
      h("td", { class: "uri", colspan: CKPT_COLUMNS, title: where },
        h("span", { class: "muted" }, "uri "), code, " ", copyButton(where, code)));
  }

  function exportCell(c) {
    const e = c.export;
    const cell = h("td", { class: "export", dataset: { state: e?.state ?? "none" } });
    const why = job && !e ? notExportable(job) : null;
    if (why) return h("td", { class: "export muted", title: why, dataset: { state: "none" } }, "–");
    if (e) cell.append(h("span", { class: `state state-${e.state}`, title: e.error ?? "" }, e.state), " ");
    if (e?.waiting_for) cell.append(h("span", { class: "export-waiting muted" }, `(${e.waiting_for})`), " ");
    if (!e || e.state === "failed") {
      cell.append(h("button", {
        type: "button", class: "export-checkpoint", onclick: (ev) => requestExport(c, ev.target),
      }, e ? "Export again" : "Export"));
    } else if (e.state === "ready") {
      cell.append(h("a", {
        href: "#", class: "download-export", title: `sha256 ${e.sha256}`,
        onclick: (ev) => { ev.preventDefault(); downloadExport(c, ev.target); },
      }, `Download (${fmtBytes(e.size_bytes)})`));
    }
    return cell;
  }

  /** What a LoRA/QLoRA run wrote at its end instead of a checkpoint export: its adapter and
   * merged model, each file a download (`GET /v1/jobs/{id}/lora`). */
  async function loadLora() {
    const found = await api(`/v1/jobs/${jobId}/lora`);
    const label = { adapter: "LoRA adapter (PEFT)", merged: "Merged model" };
    loraSlot.replaceChildren(...["adapter", "merged"].filter((k) => found[k]).map((k) =>
      h("p", { dataset: { lora: k } }, h("strong", {}, label[k]), ` at step ${found[k].step}: `,
        ...found[k].files.flatMap((f, i) => [i ? " · " : "", h("a", {
          href: "#", class: "lora-file", dataset: { file: f.name },
          onclick: (ev) => {
            ev.preventDefault();
            download(`/v1/jobs/${jobId}/lora/${k}/files/${encodeURIComponent(f.name)}`, f.name)
              .catch(showError);
          },
        }, `${f.name} (${fmtBytes(f.size_bytes)})`)]))));
  }

  async function requestExport(c, button) {
    button.disabled = true;
    try {
      await api(`/v1/jobs/${jobId}/checkpoints/${c.id}/export`, { method: "POST" });
      await loadCheckpoints();
    } catch (err) {
      showError(err);
      button.disabled = false;
    }
  }

  async function downloadExport(c, link) {
    link.setAttribute("aria-busy", "true");
    try {
      const name = `job${jobId}-step${String(c.step).padStart(8, "0")}.safetensors`;
      await download(`/v1/jobs/${jobId}/checkpoints/${c.id}/export/download`, name);
    } catch (err) {
      showError(err);
    } finally {
      link.removeAttribute("aria-busy");
    }
  }

  /** The log view, filtered to `rank` (the failure card's "all its logs"), scrolled to. */
  function showRankLogs(rank, scroll = true) {
    if (![...rankSel.options].some((o) => o.value === String(rank))) {
      rankSel.append(h("option", { value: String(rank) }, `rank ${rank}`));
    }
    rankSel.value = String(rank);
    rankSel.dispatchEvent(new Event("change"));
    if (scroll) logBox.scrollIntoView({ block: "center" });
  }

  rankSel.addEventListener("change", () => {
    rankChosen = true;
    resetLogs().catch(showError);
  });
  search.addEventListener("input", renderLogs);

  // Live: the job's event stream (SSE) pushes; each burst of messages triggers one refresh
  // over REST, which stays the source of truth (downsampled series, paged logs).
  let live = "polling";
  let stopStream = null;
  let nudge = null;
  const setLive = (mode) => { live = mode; root.dataset.live = mode; };
  function openStream() {
    // Resume after what the page already has; metric lines from a few seconds ago on, as the
    // trainer's clock (unix seconds) allows, so a long run's history is not streamed again.
    const since = Date.now() / 1000 - 10;
    const lastEventId = `${eventsAfter ?? 0}.${logsAfter ?? 0}.${since}.-1`;
    setLive("sse");
    stopStream = follow(`/v1/jobs/${jobId}/stream`, {
      lastEventId,
      onMessage: (message) => {
        if (message.event === "job") {
          const before = job.state;
          job = JSON.parse(message.data);
          renderJob();
          if (job.state === before) return; // the server's timed refresh: nothing else is new
        }
        clearTimeout(nudge);
        nudge = setTimeout(() => stop.now(), NUDGE_MS);
      },
      onEnd: () => { setLive("ended"); stop.now(); },
      onFail: () => { setLive("polling"); stop.now(); },
    });
  }

  let ended = false;
  const interval = () => (live === "sse" ? STREAM_REFRESH_MS : REFRESH_MS);
  let stop = () => {};
  const tick = async () => {
    try {
      job = await api(`/v1/jobs/${jobId}`);
    } catch (err) {
      if (err.status !== 404 || job) throw err;
      showMissing(); // no such job in this project: no page of an empty job, no live buttons
      stop();
      return;
    }
    renderJob();
    const checkpoints = evalSourceOf(job) ? null : loadCheckpoints();
    await Promise.all([loadMetrics(), loadEvents(), loadLogs(), checkpoints, evals.load(job)]);
    root.dataset.loaded = "true";
    if (TERMINAL.has(job.state)) {
      if (finalPass) { // one more pass picked up what was ingested after the end
        ended = true;
        stop();
        stopStream?.();
      }
      finalPass = true;
    } else if (!stopStream && (await capabilities()).stream) {
      openStream();
    }
  };
  stop = poll(tick, interval);

  function showMissing() {
    root.replaceChildren(h("section", { id: "job-missing", class: "panel" },
      h("h1", {}, `Job #${jobId} not found`),
      h("p", {}, "This project has no job with that id: the link may be mistyped, or the job "
        + "belongs to another project."),
      h("a", { href: "#/jobs" }, "All jobs")));
    root.dataset.loaded = "true";
  }

  // Charts first (issue 28, item 4): the title, why it failed, the figures, then the metrics;
  // the run's details, events, checkpoints, logs and its spec (folded) after them.
  root.append(
    h("h1", {}, title, kindSlot, badge, h("span", { class: "spacer" }), compareLink, clone,
      ...Object.values(actions).map((a) => a.button), cancel),
    failureSlot,
    specProblems,
    card.node,
    leadSlot,
    h("div", { class: "section-head" }, h("h2", {}, "Metrics"), toolbar),
    valuesBox,
    charts,
    systemHeading, systemCharts,
    evals.node,
    h("h2", { id: "overview-heading" }, "Overview"),
    h("div", { class: "panel" }, summary),
    card.details,
    codeSlot,
    h("div", { class: "grid2" },
      h("section", {}, h("h2", {}, "Events"), h("div", { class: "panel" }, timeline)),
      ckptSection),
    h("h2", {}, "Logs"),
    h("div", { class: "toolbar" }, rankSel, search),
    logBox,
    h("details", { id: "spec-box" }, h("summary", {}, h("h2", {}, "Spec ", specFormat)), specBox));
  return () => {
    stop();
    stopStream?.();
    clearTimeout(nudge);
    clearTimeout(exportTimer);
    for (const node of chartNodes.values()) purge(node);
  };
}
