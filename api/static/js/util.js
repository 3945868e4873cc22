// Small DOM and formatting helpers. Text always goes in as text, never as HTML.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** The API's prose with `code` in backticks (a reason, a retry summary) as text and <code>
 * nodes: the backticks are markup, not characters to show. An unpaired one stays as it is. */
export function prose(text) {
  const parts = String(text ?? "").split("`");
  if (parts.length < 3) return [String(text ?? "")];
  return parts.map((part, i) => {
    if (i % 2 === 0) return part;
    return i === parts.length - 1 ? `\`${part}` : h("code", {}, part);
  });
}

/** A log line without the rank prefix its process wrote itself (`[rank0]:`, torchrun's), as the
 * page puts `[rank N]` before each line already (torchyard.render.log_line does the same). */
export function ownPrefixDropped(rank, line) {
  const own = new RegExp(`^\\[rank ?${Number(rank)}\\]:? ?`).exec(line);
  return own ? line.slice(own[0].length) : line;
}

export const TERMINAL = new Set(["succeeded", "failed", "cancelled", "pruned"]);
export const STATES = [
  "queued", "starting", "running", "pausing", "paused", "preempting", "restarting", "cancelling",
  "succeeded", "failed", "cancelled", "pruned",
];

/** A job's state as a coloured word; `why` (a pruned job's reason) on hover. */
export function stateBadge(state, why = null) {
  return h("span", { class: `state state-${state}`, dataset: { state }, ...(why ? { title: why } : {}) }, state);
}

export function fmtNumber(value, digits = 4) {
  if (value === undefined || value === null) return "–";
  if (typeof value === "string") return value; // "NaN" / "Infinity" from the API
  // (a float past 2^53 is an "integer" too: 4.2e36 reads better than 37 digits)
  if (Number.isInteger(value) && Math.abs(value) < 1e15) return value.toLocaleString("en-US");
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  // no trailing zeros (2.5, not 2.500; 1.2e+4), as the CLI's `format_value` (Python's `g`)
  const [mantissa, exponent] = value.toPrecision(digits).split("e");
  const trimmed = mantissa.includes(".") ? mantissa.replace(/\.?0+$/, "") : mantissa;
  return exponent === undefined ? trimmed : `${trimmed}e${exponent}`;
}

// Durations and sizes read as the CLI prints them (torchyard/render.py: format_duration,
// format_bytes), so a job shows the same figures in the terminal and on its page.

/** `42s`, `3m05s`, `1h02m`, `2d03h`; `–` when unknown. */
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  const two = (n) => String(n).padStart(2, "0");
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${two(s % 60)}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${two(Math.floor((s % 3600) / 60))}m`;
  return `${Math.floor(s / 86400)}d${two(Math.floor((s % 86400) / 3600))}h`;
}

/**
 * A moment as the CLI prints it (torchyard/render.py `format_when`, less its "ago"):
 * `2026-11-25 06:47:57 UTC`; `–` when unknown.
 *
 * The rule for every page: one clock, UTC, always named. The CLI prints UTC, the trainer's log
 * lines carry UTC stamps (trainer/logs.py: `2026-11-25 06:47:56.934 UTC`), the usage report
 * counts UTC days, and the API sends UTC: a browser in Berlin or Tokyo shows the same instant
 * with the same digits as the terminal and the log line beside it, never its own zone.
 */
export function fmtTime(iso) {
  const at = iso ? new Date(iso) : null;
  if (!at || Number.isNaN(at.getTime())) return "–";
  return `${at.toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

const SI_PREFIXES = ["", "k", "M", "G", "T", "P"];

/**
 * A throughput as the CLI prints it (torchyard/units.py `format_rate`, d3's `.3s`): 3
 * significant digits and an SI prefix, `950`, `20.6k`, `4.10M`; below 1 plain (`0.5`); `–`
 * when unknown.
 */
export function fmtRate(value) {
  if (value === null || value === undefined) return "–";
  if (!Number.isFinite(value) || value < 1) return String(Number(value.toPrecision(3)));
  const [mantissa, exponent] = value.toExponential(2).split("e");
  const power = Number(exponent);
  const prefix = Math.min(Math.floor(power / 3), SI_PREFIXES.length - 1);
  const shift = power - 3 * prefix;
  return `${(Number(mantissa) * 10 ** shift).toFixed(Math.max(0, 2 - shift))}${SI_PREFIXES[prefix]}`;
}

/** A time such as a step's, as the CLI's `format_seconds`: `0.5120 s`, from a minute on a
 * duration (`3m51s`); `–` when unknown. */
export function fmtSeconds(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  return seconds >= 60 ? fmtDuration(seconds) : `${fmtNumber(seconds)} s`;
}

/** Decimal units, as the CLI: `812 B`, `8.0 kB`, `1.2 GB`; `–` when unknown. */
export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
  return i === 0 ? `${Math.trunc(v)} B` : `${v.toFixed(1)} ${units[i]}`;
}

/** How long the job trained and, when longer, its span from start to end (as the CLI's
 * `trained_text`): "3m38s of 3m51s from start to end". */
export function trainedText(job) {
  const trained = fmtDuration(runSeconds(job));
  if (!job.started_at || !job.finished_at || runSeconds(job) === null) return trained;
  const span = (Date.parse(job.finished_at) - Date.parse(job.started_at)) / 1000;
  if (Math.round(span) - Math.round(runSeconds(job)) < 1) return trained;
  return `${trained} of ${fmtDuration(span)} from start to end`;
}

/**
 * Seconds the job has trained, every attempt together (the API's `running_s`: pauses and
 * restarts do not reset it), or null before it first ran.
 */
export function runSeconds(job) {
  return job.running_s ?? null;
}

/** Seconds left at the recent step rate (the API's `eta_s`), or null when unknown. */
export function etaSeconds(job) {
  return TERMINAL.has(job.state) ? null : job.eta_s ?? null;
}

/** A waiting job's place, reason and estimated start ("#3 · quota gpus 2/2 · starts in ~5m"),
 *  or null when it does not wait (`job.queue`). */
export function queueText(job, now = Date.now()) {
  const q = job.queue;
  if (!q) return null;
  const parts = q.position ? [`#${q.position}`, q.reason] : [q.reason];
  if (q.estimated_start_at) {
    const wait = Math.max(0, (Date.parse(q.estimated_start_at) - now) / 1000);
    parts.push(`starts in ~${fmtDuration(wait)}`);
  }
  return parts.join(" · ");
}

/**
 * Run `fn` now and then every `ms` (a number, or a function giving it) until the returned
 * stop function is called; `stop.now()` runs it early (coalesced with a run in flight).
 */
export function poll(fn, ms) {
  const interval = typeof ms === "function" ? ms : () => ms;
  let stopped = false;
  let timer = null;
  let running = false;
  let again = false;
  const tick = async () => {
    if (stopped) return;
    if (running) { again = true; return; }
    running = true;
    clearTimeout(timer);
    try { await fn(); } catch (err) { if (!stopped) showError(err); }
    running = false;
    if (stopped) return;
    if (again) { again = false; tick(); return; }
    timer = setTimeout(tick, interval());
  };
  tick();
  const stop = () => { stopped = true; clearTimeout(timer); };
  stop.now = tick;
  return stop;
}

export function showError(err) {
  const bar = document.getElementById("flash") ?? document.body.appendChild(
    h("div", { id: "flash", role: "alert" }));
  bar.textContent = err?.message ?? String(err);
  bar.hidden = false;
}

export function clearError() {
  const bar = document.getElementById("flash");
  if (bar) bar.hidden = true;
}

const PLAIN = /^[A-Za-z_][\w./-]*$/;
const LOOKS_TYPED = /^(true|false|null|yes|no|on|off|~|[-+]?(\d|\.\d))/i;
// Keys a YAML 1.1 reader (PyYAML) would turn into booleans or null: `retries.on` stays a string.
const KEY_TYPED = /^(true|false|null|yes|no|on|off|y|n|~)$/i;

function yamlScalar(value) {
  if (value === null || value === undefined) return "null";
  if (typeof value === "number") { // 1e-7 -> 1.0e-7: a float for YAML 1.1 readers (PyYAML) too
    const text = String(value);
    return /e/.test(text) && !text.includes(".") ? text.replace("e", ".0e") : text;
  }
  if (typeof value !== "string") return String(value);
  return PLAIN.test(value) && !LOOKS_TYPED.test(value) ? value : JSON.stringify(value);
}

/** A JSON value as block-style YAML, for reading (JSON strings are valid YAML scalars). */
export function toYaml(value, indent = "") {
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    if (value.every((v) => v === null || typeof v !== "object")) {
      return `[${value.map(yamlScalar).join(", ")}]`;
    }
    return value.map((v) => `\n${indent}- ${toYaml(v, `${indent}  `).trimStart()}`).join("");
  }
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value);
    if (!keys.length) return "{}";
    return keys.map((k) => {
      const v = value[k];
      const key = PLAIN.test(k) && !KEY_TYPED.test(k) ? k : JSON.stringify(k);
      const nested = v !== null && typeof v === "object" && Object.keys(v).length
        && !(Array.isArray(v) && v.every((x) => x === null || typeof x !== "object"));
      return nested ? `\n${indent}${key}:${toYaml(v, `${indent}  `)}` : `\n${indent}${key}: ${toYaml(v, indent)}`;
    }).join("");
  }
  return yamlScalar(value);
}

/**
 * A Copy button for `text`: onto the clipboard, or else `node` selected for Ctrl+C (a page
 * without clipboard access); `status` (optional) says which happened.
 */
export function copyButton(text, node, status) {
  return h("button", { type: "button", class: "copy", title: `copy ${text}`, onclick: async () => {
    try {
      await navigator.clipboard.writeText(text);
      if (status) status.textContent = "Copied.";
    } catch {
      getSelection().selectAllChildren(node);
      if (status) status.textContent = "Selected: press Ctrl+C to copy.";
    }
  } }, "Copy");
}
