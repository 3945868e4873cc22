// The compare view's arithmetic, pure functions of the API's answers: TensorBoard's debiased
// EMA, the x axes (step, tokens seen, wall time), and what differs between the runs' specs.

import { fmtDuration } from "./util.js";

/** The x axes a chart can use: `title` labels the axis, `format` is a d3 format for its ticks,
 * `hover` how a hover label writes a value (seconds as the CLI's durations: "47s", "3m51s"). */
export const X_AXES = {
  step: { title: "step" },
  tokens: { title: "tokens seen", format: ".3s" },
  time: { title: "wall time (s)", hover: { title: "wall time", text: fmtDuration } },
};

/** Schedules are what the spec set, not noise: never smoothed (Compare, the job page). */
export const SCHEDULES = new Set(["lr", "epoch"]);

/** A value of the API as a number to plot: "NaN"/"Infinity" strings and non-finite -> null. */
export function plotValue(v) {
  const y = Number(v);
  return Number.isFinite(y) ? y : null;
}

/**
 * TensorBoard's smoothing: an exponential moving average with weight `w` (0 = raw, 0.99 =
 * very smooth), debiased (divided by 1 - w^n) so the start is not pulled towards zero. Gaps
 * (null) stay gaps and do not move the average.
 */
export function ema(values, w) {
  if (!(w > 0)) return values.slice();
  let last = 0;
  let n = 0;
  return values.map((y) => {
    if (y === null) return null;
    last = last * w + (1 - w) * y;
    n += 1;
    return last / (1 - w ** n);
  });
}

/**
 * Tokens a run consumes per optimizer step, from what the trainer reports with every train
 * line (tokens_per_second = tokens_per_step / step_time_s): the median of their products at
 * the steps both series hold. Null when the run reports either not (a script job may not).
 */
export function tokensPerStep(byName) {
  const rate = byName.get("tokens_per_second");
  const time = byName.get("step_time_s");
  if (!rate || !time) return null;
  const seconds = new Map(time.steps.map((s, i) => [s, plotValue(time.values[i])]));
  const products = rate.steps.map((s, i) => (plotValue(rate.values[i]) ?? NaN) * (seconds.get(s) ?? NaN))
    .filter((p) => Number.isFinite(p) && p > 0).sort((a, b) => a - b);
  return products.length ? Math.round(products[Math.floor(products.length / 2)]) : null;
}

/**
 * The x values of series `s` of `run` ({byName, tokensPerStep, t0}) on `axis`, or null when
 * the run lacks what that axis needs (tokens per step; the points' times).
 */
export function xValues(run, s, axis) {
  if (axis === "tokens") return run.tokensPerStep ? s.steps.map((step) => step * run.tokensPerStep) : null;
  if (axis === "time") return s.times ? s.times.map((t) => Math.round((t - run.t0) * 1000) / 1000) : null;
  return s.steps;
}

/** The earliest time among a run's series (wall time 0), or null when none has times. */
export function startTime(series) {
  const firsts = series.map((s) => s.times?.[0]).filter(Number.isFinite);
  return firsts.length ? Math.min(...firsts) : null;
}

/** `{a: {b: 1}, c: [1, 2]}` -> `{"a.b": 1, "c": "[1,2]"}`: leaves by dotted path, lists as JSON. */
export function flatten(value, prefix = "", out = {}) {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    const keys = Object.keys(value);
    if (!keys.length && prefix) out[prefix] = "{}";
    for (const k of keys) flatten(value[k], prefix ? `${prefix}.${k}` : k, out);
  } else if (prefix) {
    out[prefix] = Array.isArray(value) ? JSON.stringify(value) : value;
  }
  return out;
}

/**
 * The spec fields that differ between runs: [[dotted path, [value of each run]]], sorted by
 * path; a field one run lacks counts as null. `name` is left out (each column says it).
 */
export function configDiff(specs) {
  const flat = specs.map((s) => flatten(s ?? {}));
  const paths = [...new Set(flat.flatMap((f) => Object.keys(f)))].filter((p) => p !== "name").sort();
  return paths.map((p) => [p, flat.map((f) => f[p] ?? null)])
    .filter(([, values]) => new Set(values.map((v) => JSON.stringify(v))).size > 1);
}

/**
 * A run's results: [label, value] with the last and the lowest train and eval loss; with
 * `rewards` (a GRPO run among those compared) first the last training reward and the last
 * and highest held-out reward, which is what such a run is read by.
 */
export function finals(byName, rewards = false) {
  const last = (name) => byName.get(name)?.last?.value;
  const extreme = (name, pick) => {
    const values = (byName.get(name)?.values ?? []).map(plotValue).filter((v) => v !== null);
    return values.length ? pick(...values) : undefined;
  };
  const losses = [
    ["final loss", last("loss")], ["best loss", extreme("loss", Math.min)],
    ["final eval loss", last("eval_loss")], ["best eval loss", extreme("eval_loss", Math.min)],
  ];
  if (!rewards) return losses;
  return [
    ["final reward", last("reward")], ["final eval reward", last("eval_reward")],
    ["best eval reward", extreme("eval_reward", Math.max)], ...losses,
  ];
}

// The worker's `sys/<quantity>/<source>` series (workers/watchers/sysmetrics.py) as a reader
// names them: "RSS, node 0", "CPU %, rank 1", "memory used, GPU 0".
const SYSTEM_QUANTITIES = {
  cpu_percent: "CPU %", rss_bytes: "RSS", gpu_util_percent: "utilisation %",
  gpu_memory_bytes: "memory used", gpu_power_watts: "power (W)",
};

/**
 * Where a `sys/*` series was measured: `node` (null when unknown: a rank of runs whose
 * `procs_per_node` differ) and `source` ("rank 1", "GPU 0", "node 0"). A rank's node is
 * rank // procs_per_node; nodes other than 0 name their GPUs `node<n>-gpu<i>`.
 */
export function systemSource(name, procsPerNode) {
  const source = name.split("/").slice(2).join("/");
  let m = /^rank(\d+)$/.exec(source);
  if (m) return { node: procsPerNode ? Math.floor(Number(m[1]) / procsPerNode) : null, source: `rank ${m[1]}` };
  m = /^node(\d+)$/.exec(source);
  if (m) return { node: Number(m[1]), source: `node ${m[1]}` };
  m = /^(?:node(\d+)-)?gpu(\d+)$/.exec(source);
  if (m) return { node: Number(m[1] ?? 0), source: `GPU ${m[2]}` };
  return { node: null, source };
}

/** A metric's name as the picker and chart titles show it: system series in words, the
 * trainer's own (`loss`, `step_time_s/max`) as they are written. */
export function metricLabel(name) {
  if (!name.startsWith("sys/")) return name;
  const quantity = name.split("/")[1];
  return `${SYSTEM_QUANTITIES[quantity] ?? quantity}, ${systemSource(name).source}`;
}

/** The metric's group in the picker: train, eval, or "system, node <n>" (system when the node
 * is unknown). */
export function metricGroup(name, procsPerNode) {
  if (name.startsWith("sys/")) {
    const { node } = systemSource(name, procsPerNode);
    return node === null ? "system" : `system, node ${node}`;
  }
  return name.startsWith("eval") || name.includes("eval_") ? "eval" : "train";
}
