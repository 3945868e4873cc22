// Script jobs (docs/CONTRACTS.md section 5): a spec with `entrypoint` runs the team's own code
// from an uploaded archive instead of the built-in trainer. Their kind, their command as a shell
// line, and the "Code" card of their page.

import { api, capabilities } from "./api.js";
import { fmtBytes, h } from "./util.js";

/** The job's `entrypoint` section (a script job), or null (the built-in trainer). */
export function entrypointOf(job) {
  return job?.spec?.entrypoint ?? null;
}

/** "script" or "trainer". */
export function jobKind(job) {
  return entrypointOf(job) ? "script" : "trainer";
}

/** A badge that marks a script job (lists, titles). */
export function scriptBadge() {
  return h("span", { class: "kind kind-script", dataset: { kind: "script" }, title: "runs its own code (entrypoint)" }, "script");
}

const SHELL_SAFE = /^[A-Za-z0-9@%+=:,./_-]+$/;

/** One argument as a POSIX shell reads it back (as Python's shlex.quote). */
export function shellQuote(arg) {
  if (arg === "") return "''";
  return SHELL_SAFE.test(arg) ? arg : `'${arg.replace(/'/g, `'"'"'`)}'`;
}

/** An argv as one shell line: ["python", "train.py", "--note", "a b"] -> python train.py --note 'a b'. */
export function shellLine(argv) {
  return argv.map(shellQuote).join(" ");
}

// GET /v1/code/{id}, once per archive and page life; null when the API has no such route.
const archives = new Map();
async function archive(codeId) {
  const { codePath } = await capabilities();
  if (!codePath) return null;
  if (!archives.has(codeId)) {
    const path = codePath.replace(/\{[^}]+\}/, encodeURIComponent(codeId));
    archives.set(codeId, api(path).catch(() => { archives.delete(codeId); return null; }));
  }
  return archives.get(codeId);
}

function archiveLine(found) {
  if (!found) return [];
  const parts = [found.name, found.format, fmtBytes(found.size_bytes),
    found.num_files !== undefined ? `${found.num_files} file${found.num_files === 1 ? "" : "s"}` : null];
  const files = found.files?.length
    ? h("details", { id: "code-files" }, h("summary", {}, "files"), chips(found.files, ""))
    : null;
  return [" ", h("span", { class: "muted", id: "code-archive-info", title: found.sha256 ? `sha256 ${found.sha256}` : "" },
    parts.filter((p) => p !== null && p !== undefined).join(" · ")), files];
}

function chips(items, empty) {
  if (!items.length) return h("span", { class: "muted" }, empty);
  return h("ul", { class: "chips" }, ...items.map((text) => h("li", {}, h("code", {}, text))));
}

/**
 * The "Code" card of a script job's page: the archive (its name, size and files when the API
 * serves GET /v1/code/{id}), the command as a shell line, env (NAME=value, as submitted; they
 * are the team's settings, not secrets), requirements and checkpoint retention. Null for a
 * trainer job.
 */
export function codeCard(job) {
  const ep = entrypointOf(job);
  if (!ep) return null;
  const archiveCell = h("dd", { dataset: { field: "archive" } }, h("code", { id: "code-archive" }, ep.code));
  archive(ep.code).then((found) => archiveCell.append(...archiveLine(found))).catch(() => {});
  const env = Object.entries(ep.env ?? {}).sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}=${shellQuote(v)}`);
  const keep = ep.keep_last_checkpoints;
  const rows = [
    ["archive", archiveCell],
    ["command", h("pre", { class: "command", id: "code-command" }, shellLine(ep.command ?? []))],
    ["env", chips(env, "none")],
    ["requirements", chips(ep.requirements ?? [], "none (the worker's Python)")],
    ["checkpoints kept", keep ? `the last ${keep}` : "all"],
  ];
  return h("section", { id: "code-card" },
    h("h2", {}, "Code"),
    h("dl", { class: "panel code-kv" }, ...rows.flatMap(([k, v]) => [h("dt", {}, k),
      v instanceof HTMLElement && v.tagName === "DD" ? v : h("dd", { dataset: { field: k } }, v)])));
}
