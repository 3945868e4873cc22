// Why a job failed: the card a failed job's page starts with (class, reason, where, what the
// retry policy did, the failing rank's last log lines), and the warning line of a job that
// restarted after a failure. Everything comes from the job itself (`failure`, `retry_policy`).

import { h, prose } from "./util.js";

/** "rank 3 on host-b": the failing rank and its host (or node), as far as known. */
function place(f) {
  const host = f.host ?? (f.node_rank !== null && f.node_rank !== undefined ? `node ${f.node_rank}` : null);
  if (f.rank !== null && f.rank !== undefined) return host ? `rank ${f.rank} on ${host}` : `rank ${f.rank}`;
  return host ? `on ${host}` : "";
}

export function failureClassBadge(cls, reason) {
  return h("span", { class: `fclass fclass-${cls}`, title: reason ?? "", dataset: { failureClass: cls } }, cls);
}

function whereList(f, exitCode) {
  const pairs = [["rank", f.rank], ["node", f.node_rank], ["host", f.host], ["exit code", exitCode]]
    .filter(([, v]) => v !== null && v !== undefined);
  return h("dl", { class: "failure-where" }, ...pairs.map(([k, v]) =>
    h("div", {}, h("dt", {}, k), h("dd", { dataset: { field: k } }, String(v)))));
}

function failedCard(job, onRankLogs) {
  const f = job.failure;
  // A failed job without a recorded failure (a runtime limit, a job from before failures were
  // classed): its `error` says why.
  const [reason, ...rest] = f ? [f.reason] : (job.error ?? "no reason recorded").split("\n");
  const tail = f ? (f.log_tail ?? []) : rest;
  return h("section", { id: "failure", class: "failure-card", "aria-label": "why it failed" },
    h("div", { class: "failure-head" },
      h("span", { class: "failure-title" }, "Failed"),
      f ? failureClassBadge(f.failure_class) : null,
      h("span", { class: "reason" }, prose(reason))),
    f ? whereList(f, f.exit_code ?? job.exit_code) : null,
    // What the platform noticed (a host path named on the command line that the sandbox hides).
    f?.hints?.length ? h("ul", { class: "failure-hints", id: "failure-hints" },
      ...f.hints.map((hint) => h("li", {}, prose(hint)))) : null,
    job.retry_policy ? h("p", { class: "retry-summary" }, prose(job.retry_policy.summary)) : null,
    f?.failure_class === "user_error" ? h("p", { class: "muted", id: "retry-advice" },
      "A user error fails the same way when retried: Clone and edit the spec, or fix the "
      + "data or code first.") : null,
    tail.length ? [
      h("div", { class: "muted tail-title" },
        f && f.rank !== null && f.rank !== undefined ? `Last log lines of rank ${f.rank}` : "Last log lines",
        onRankLogs && f && f.rank !== null && f.rank !== undefined
          ? [" · ", h("button", { id: "failing-rank-logs", type: "button", class: "link",
            onclick: () => onRankLogs(f.rank) }, "all its logs")] : null),
      h("pre", { class: "log-tail" }, tail.join("\n")),
    ] : null);
}

function warningLine(job) {
  const f = job.failure;
  const where = place(f);
  return h("div", { id: "failure", class: "failure-warning", "aria-label": "last failure" },
    h("strong", {}, "Last failure "), failureClassBadge(f.failure_class), " ",
    h("span", { class: "reason" }, prose(f.reason)),
    where ? h("span", { class: "muted" }, ` (${where})`) : null,
    job.retry_policy ? h("span", { class: "muted retry-summary" }, " · ",
      prose(job.retry_policy.summary)) : null);
}

/** The failure card of a failed job, the warning line of a job restarted after a failure, or
 * null for a job that never failed. `onRankLogs(rank)`, when given, is what the card's "all its
 * logs" button does (the page's log view, filtered to the failing rank). */
export function failureView(job, onRankLogs) {
  if (job.state === "failed") return failedCard(job, onRankLogs);
  return job.failure ? warningLine(job) : null;
}
