// Jobs: a filtered, paginated table (the API's cursor) that refreshes while it is shown.

import { api, capabilities } from "./api.js";
import { entrypointOf, scriptBadge } from "./code.js";
import { evalBadge, evalSourceOf } from "./evals.js";
import { failureClassBadge } from "./failure.js";
import {
  STATES, etaSeconds, fmtDuration, fmtNumber, fmtTime, h, poll, queueText, runSeconds,
  stateBadge,
} from "./util.js";

const PAGE_SIZE = 25;
const REFRESH_MS = 2000;

function progressCell(job) {
  if (!job.max_steps) { // a script job: its end is its own, only the step is known
    return h("td", { class: "num" }, job.current_step === null || job.current_step === undefined
      ? "–" : `step ${job.current_step}`);
  }
  const step = job.current_step ?? 0;
  const pct = job.max_steps ? Math.min(100, (100 * step) / job.max_steps) : 0;
  const eta = etaSeconds(job);
  return h("td", { class: "num progress-cell" },
    h("span", { class: "progress" }, h("span", { style: `width:${pct.toFixed(1)}%` })),
    `${step}/${job.max_steps}`,
    eta !== null ? h("span", { class: "muted" }, ` · ETA ${fmtDuration(eta)}`) : "",
    queueText(job) ? h("span", { class: "muted queue", title: job.waiting_for ?? "" },
      ` · ${queueText(job)}`) : "");
}

function jobRow(job, onLabel) {
  const res = job.spec?.resources ?? {};
  const script = Boolean(entrypointOf(job));
  let strategy = script ? scriptBadge() : (job.spec?.parallelism?.strategy ?? "ddp");
  if (evalSourceOf(job)) strategy = evalBadge(); // it trains nothing: no strategy
  const loss = job.latest_metrics?.loss;
  // GRPO is read by its rewards (its loss is ~0 by construction, its eval_loss -eval_reward)
  const grpo = job.spec?.method?.kind === "grpo";
  const reward = (value) => (typeof value === "number" ? `reward ${fmtNumber(value)}` : "–");
  return h("tr", { dataset: { jobId: job.id } },
    h("td", { class: "num" }, h("a", { href: `#/jobs/${job.id}` }, `#${job.id}`)),
    h("td", { class: "name-cell" }, h("a", { href: `#/jobs/${job.id}`, class: "job-name" }, job.name),
      ...Object.entries(job.labels ?? {}).map(([k, v]) => h("button", {
        type: "button", class: "label", title: "show only jobs with this label",
        onclick: () => onLabel(`${k}=${v}`),
      }, `${k}=${v}`))),
    h("td", {}, stateBadge(job.state, job.state === "pruned" ? job.error : null),
      // and why a failed one failed (the reason on hover)
      job.state === "failed" && job.failure
        ? [" ", failureClassBadge(job.failure.failure_class, job.failure.reason)] : null),
    h("td", { class: "col-strategy" }, strategy),
    h("td", { class: "num col-nodes" }, `${res.nodes ?? 1} × ${res.procs_per_node ?? 1}`),
    progressCell(job),
    grpo
      ? h("td", { class: "num loss", title: "the last step's mean reward (GRPO)" },
        reward(job.latest_metrics?.reward))
      : h("td", { class: "num loss" }, fmtNumber(loss)),
    grpo
      ? h("td", { class: "num best-eval", title: "the highest held-out reward (GRPO)" },
        reward(typeof job.best_eval_loss === "number" ? -job.best_eval_loss : null))
      : h("td", { class: "num best-eval", title: "the lowest eval loss reported" },
        fmtNumber(job.best_eval_loss)),
    h("td", { class: "owner col-owner" }, job.owner ?? "–"),
    h("td", { class: "col-created" }, fmtTime(job.created_at)),
    h("td", { class: "num col-duration" }, fmtDuration(runSeconds(job))),
    h("td", {}, h("input", {
      type: "checkbox", class: "pick", value: String(job.id), "aria-label": `compare ${job.id}`,
    })));
}

/** `team=nlp, tier=a` -> ["team=nlp", "tier=a"] (the API's repeatable `label`). */
function labelPairs(text) {
  return text.split(/[\s,]+/).filter((p) => p.includes("="));
}

export function jobsPage(root, query) {
  const stateSel = h("select", { id: "state-filter", "aria-label": "state" },
    h("option", { value: "" }, "all states"),
    STATES.map((s) => h("option", { value: s, selected: query.get("state") === s }, s)));
  const nameInput = h("input", {
    id: "name-filter", type: "search", placeholder: "name contains…",
    value: query.get("name") ?? "", "aria-label": "name",
  });
  const labelInput = h("input", {
    id: "label-filter", type: "search", placeholder: "labels: team=nlp …",
    value: query.getAll("label").join(" "), "aria-label": "labels",
  });
  capabilities().then(({ states }) => {
    if (!states) return;
    const chosen = stateSel.value;
    stateSel.replaceChildren(h("option", { value: "" }, "all states"),
      ...states.map((s) => h("option", { value: s }, s)));
    stateSel.value = chosen;
  }).catch(() => {}); // the built-in list stays
  const body = h("tbody", { id: "jobs-body" });
  const info = h("span", { class: "muted", id: "jobs-info" });
  const prev = h("button", { id: "prev-page", type: "button" }, "← Previous");
  const next = h("button", { id: "next-page", type: "button" }, "Next →");
  const compare = h("button", {
    id: "compare-selected", type: "button", disabled: true,
  }, "Compare selected");
  const cursors = [null]; // cursors[i] fetches page i
  let pageIndex = 0;
  let nextCursor = null;
  const picked = new Set();
  // The API sorts (keyset-paged, so any page of 100k jobs costs the same): `-created` etc.
  let sort = query.get("sort") ?? "-created";
  const headers = [];
  const header = (label, key, cls) => {
    const th = h("th", { class: cls, dataset: key ? { sort: key } : {} }, label);
    if (key) {
      th.classList.add("sortable");
      th.addEventListener("click", () => {
        const key0 = sort.replace(/^-/, "");
        // a new column starts ascending (names A-Z), except time: newest first
        sort = key0 === key ? (sort.startsWith("-") ? key : `-${key}`)
          : (key === "created" ? "-created" : key);
        refilter();
      });
      headers.push(th);
    }
    return th;
  };
  const showSort = () => {
    for (const th of headers) {
      th.removeAttribute("aria-sort");
      if (th.dataset.sort === sort.replace(/^-/, "")) {
        th.setAttribute("aria-sort", sort.startsWith("-") ? "descending" : "ascending");
      }
    }
  };
  const filters = () => ({
    state: stateSel.value || undefined, name: nameInput.value.trim() || undefined,
    label: labelPairs(labelInput.value), sort: sort === "-created" ? undefined : sort,
  });
  const keepInUrl = () => { // shareable, without a hashchange (which would rebuild the page)
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(filters())) {
      for (const x of Array.isArray(v) ? v : [v]) if (x) params.append(k, x);
    }
    const hash = `#/jobs${params.size ? `?${params}` : ""}`;
    if (window.location.hash !== hash) history.replaceState(null, "", hash);
  };

  async function load() {
    const page = await api("/v1/jobs", {
      query: { ...filters(), limit: PAGE_SIZE, cursor: cursors[pageIndex] ?? undefined },
    });
    nextCursor = page.next_cursor;
    body.replaceChildren(...page.items.map((job) => jobRow(job, (pair) => {
      labelInput.value = pair;
      refilter();
    })));
    for (const box of body.querySelectorAll("input.pick")) {
      box.checked = picked.has(box.value);
      box.addEventListener("change", () => {
        if (box.checked) picked.add(box.value); else picked.delete(box.value);
        compare.disabled = picked.size < 1;
      });
    }
    if (!page.items.length) {
      body.append(h("tr", {}, h("td", { colspan: 12, class: "muted" }, "No jobs match.")));
    }
    info.textContent = `page ${pageIndex + 1} · ${page.items.length} jobs`;
    prev.disabled = pageIndex === 0;
    next.disabled = !nextCursor;
    showSort();
    root.dataset.loaded = "true";
  }

  let stop = poll(load, REFRESH_MS);
  const restart = () => { stop(); stop = poll(load, REFRESH_MS); };
  const refilter = () => { cursors.length = 1; pageIndex = 0; keepInUrl(); restart(); };
  stateSel.addEventListener("change", refilter);
  let typing = null;
  for (const input of [nameInput, labelInput]) {
    input.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(refilter, 250); });
  }
  prev.addEventListener("click", () => { pageIndex = Math.max(0, pageIndex - 1); restart(); });
  next.addEventListener("click", () => {
    if (!nextCursor) return;
    cursors[pageIndex + 1] = nextCursor;
    pageIndex += 1;
    restart();
  });
  compare.addEventListener("click", () => {
    window.location.hash = `#/compare?ids=${[...picked].join(",")}`;
  });

  root.append(
    h("h1", {}, "Jobs"),
    h("div", { class: "toolbar" }, stateSel, nameInput, labelInput, info, h("span", { class: "spacer" }),
      compare, h("a", { href: "#/submit" }, h("button", { class: "primary", type: "button" }, "New job"))),
    h("div", { class: "jobs-wrap" }, h("table", { id: "jobs-table" },
      h("thead", {}, h("tr", {},
        header("id", null, "num"), header("name", "name"), header("state", "state"),
        header("strategy", null, "col-strategy"), header("nodes × procs", null, "num col-nodes"),
        header("progress", null, "num"), header("final loss", null, "num"),
        header("best eval", null, "num"), header("owner", null, "col-owner"),
        header("created", "created", "col-created"), header("duration", null, "num col-duration"),
        header("cmp"))),
      body)),
    h("div", { class: "pager" }, prev, next));
  return () => { stop(); clearTimeout(typing); };
}
