// The public REST API (docs/CONTRACTS.md, section 4), with the key from the browser's storage.

const KEY = "torchyard.apiKey";

export class ApiError extends Error {
  constructor(status, body) {
    const error = body?.error ?? {};
    super(error.message ?? `HTTP ${status}`);
    this.status = status;
    this.code = error.code;
    this.details = error.details ?? [];
  }
}

// The key lives in this tab's sessionStorage, or in localStorage (every tab, kept across
// restarts) when the user ticks "remember on this browser"; signing out clears both.
export const auth = {
  get key() { return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY); },
  set key(value) { this.keep(value, false); },
  /** Keep `value` for this tab, or in the browser when `remember`; null forgets it. */
  keep(value, remember) {
    sessionStorage.removeItem(KEY);
    localStorage.removeItem(KEY);
    if (value) (remember ? localStorage : sessionStorage).setItem(KEY, value);
  },
};

/** The sign-in page's address that comes back to `hash` (a deep link) once signed in. */
export function loginHash(hash = window.location.hash) {
  const target = hash.replace(/^#/, "");
  // Already there (several requests of one page may answer 401): keep its `next`.
  if (target.startsWith("/login")) return `#${target}`;
  if (!target || target === "/") return "#/login";
  return `#/login?next=${encodeURIComponent(target)}`;
}

/**
 * Call the API: `body` goes as JSON; `text` as is, with `contentType` (e.g. a YAML spec).
 * Throws ApiError with the contract's error body on a non-2xx answer.
 */
export async function api(path, { method = "GET", body, text, contentType, query, key, signal } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value === undefined || value === null || value === "") continue;
    for (const v of Array.isArray(value) ? value : [value]) url.searchParams.append(name, v);
  }
  const headers = { Authorization: `Bearer ${key ?? auth.key ?? ""}` };
  let payload;
  if (text !== undefined) {
    headers["Content-Type"] = contentType ?? "text/plain";
    payload = text;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const answer = await fetch(url, { method, headers, body: payload, signal });
  const raw = await answer.text();
  const data = raw ? JSON.parse(raw) : null;
  if (!answer.ok) {
    const err = new ApiError(answer.status, data);
    if (answer.status === 401 && !key) {
      auth.key = null;
      window.location.hash = loginHash();
    }
    throw err;
  }
  return data;
}

/**
 * Download a file the API streams (e.g. a checkpoint export) with the Bearer key: the key is
 * not a cookie, so a plain link cannot carry it. fetch + blob, then a temporary object URL.
 * Throws ApiError on a non-2xx answer. Returns the size in bytes.
 */
export async function download(path, fallbackName) {
  const answer = await fetch(new URL(path, window.location.origin), {
    headers: { Authorization: `Bearer ${auth.key ?? ""}` },
  });
  if (!answer.ok) {
    const raw = await answer.text();
    let data = null;
    try { data = raw ? JSON.parse(raw) : null; } catch { data = null; }
    throw new ApiError(answer.status, data);
  }
  const disposition = answer.headers.get("Content-Disposition") ?? "";
  const name = /filename="([^"]+)"/.exec(disposition)?.[1] ?? fallbackName;
  const blob = await answer.blob();
  const url = URL.createObjectURL(blob);
  const link = Object.assign(document.createElement("a"), { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000); // the browser has taken it by then
  return blob.size;
}

/** Every item of a paginated `after`-cursor listing, from `after` on. */
export async function pageAfter(path, { after, query = {}, limit = 1000 } = {}) {
  const items = [];
  let cursor = after;
  for (;;) {
    const page = await api(path, { query: { ...query, after: cursor, limit } });
    items.push(...page.items);
    if (page.items.length) cursor = page.items[page.items.length - 1].id;
    if (!page.next_cursor) return { items, last: cursor };
  }
}

let openapi = null;

/**
 * What this API offers, from its public OpenAPI document: job states, control actions, the
 * event stream, whether it lists code archives (`codeList`) and `codePath`, the path template
 * of one code archive (or null).
 */
export function capabilities() {
  openapi ??= fetch("/openapi.json").then((r) => r.json()).then((doc) => ({
    codeList: Boolean(doc.paths?.["/v1/code"]?.get),
    codePath: Object.keys(doc.paths ?? {})
      .find((p) => /^\/v1\/code\/\{[^}]+\}$/.test(p) && doc.paths[p].get) ?? null,
    states: doc.components?.schemas?.JobState?.enum ?? null,
    actions: ["cancel", "pause", "resume", "retry"]
      .filter((a) => doc.paths?.[`/v1/jobs/{job_id}/${a}`]?.post),
    stream: Boolean(doc.paths?.["/v1/jobs/{job_id}/stream"]?.get),
  }));
  return openapi;
}
