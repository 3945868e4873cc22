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

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
export const STATES = [
  "queued", "starting", "running", "pausing", "paused", "preempting", "restarting", "cancelling",
  "succeeded", "failed", "cancelled",
];

export function stateBadge(state) {
  return h("span", { class: `state state-${state}`, dataset: { state } }, state);
}

export function fmtNumber(value, digits = 4) {
  if (value === undefined || value === null) return "–";
  if (typeof value === "string") return value; // "NaN" / "Infinity" from the API
  // (a float past 2^53 is an "integer" too: 4.2e36 reads better than 37 digits)
  if (Number.isInteger(value) && Math.abs(value) < 1e15) return value.toLocaleString("en-US");
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return value.toPrecision(digits);
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return d.toLocaleString("en-GB", { dateStyle: "short", timeStyle: "medium" });
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
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
