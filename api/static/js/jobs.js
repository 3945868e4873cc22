// Jobs: a filtered, paginated table (the API's cursor) that refreshes while it is shown.

import { api, capabilities } from "./api.js";
import {
  STATES, etaSeconds, fmtDuration, fmtNumber, fmtTime, h, poll, runSeconds, stateBadge,
} from "./util.js";

const PAGE_SIZE = 25;
const REFRESH_MS = 2000;

function progressCell(job) {
  const step = job.current_step ?? 0;
  const pct = job.max_steps ? Math.min(100, (100 * step) / job.max_steps) : 0;
  const eta = etaSeconds(job);
  return h("td", { class: "num" },
    h("span", { class: "progress" }, h("span", { style: `width:${pct.toFixed(1)}%` })),
    `${step}/${job.max_steps}`,
    eta !== null ? h("span", { class: "muted" }, ` · ETA ${fmtDuration(eta)}`) : "",
    job.queue_position ? h("span", { class: "muted", title: job.waiting_for ?? "" },
      ` · #${job.queue_position} in queue`) : "");
}

function jobRow(job) {
  const res = job.spec?.resources ?? {};
  const strategy = job.spec?.parallelism?.strategy ?? "ddp";
  const loss = job.latest_metrics?.loss;
  return h("tr", { dataset: { jobId: job.id } },
    h("td", { class: "num" }, h("a", { href: `#/jobs/${job.id}` }, `#${job.id}`)),
    h("td", {}, h("a", { href: `#/jobs/${job.id}`, class: "job-name" }, job.name),
      ...Object.entries(job.labels ?? {}).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`))),
    h("td", {}, stateBadge(job.state)),
    h("td", {}, strategy),
    h("td", { class: "num" }, `${res.nodes ?? 1} × ${res.procs_per_node ?? 1}`),
    progressCell(job),
    h("td", { class: "num" }, fmtNumber(loss)),
    h("td", {}, fmtTime(job.created_at)),
    h("td", { class: "num" }, fmtDuration(runSeconds(job))),
    h("td", {}, h("input", {
      type: "checkbox", class: "pick", value: String(job.id), "aria-label": `compare ${job.id}`,
    })));
}

// Sort keys of the table's columns; sorting orders the page on screen (the API pages by id).
const SORTS = {
  id: (j) => j.id,
  name: (j) => j.name.toLowerCase(),
  state: (j) => j.state,
  progress: (j) => (j.max_steps ? (j.current_step ?? 0) / j.max_steps : 0),
  loss: (j) => (typeof j.latest_metrics?.loss === "number" ? j.latest_metrics.loss : Infinity),
  created: (j) => j.created_at,
  duration: (j) => runSeconds(j) ?? -1,
};

function sorted(items, key, dir) {
  if (!key) return items;
  const value = SORTS[key];
  return [...items].sort((a, b) => {
    const x = value(a);
    const y = value(b);
    return (x < y ? -1 : x > y ? 1 : 0) * dir || b.id - a.id;
  });
}

export function jobsPage(root, query) {
  const stateSel = h("select", { id: "state-filter", "aria-label": "state" },
    h("option", { value: "" }, "all states"),
    STATES.map((s) => h("option", { value: s, selected: query.get("state") === s }, s)));
  const nameInput = h("input", {
    id: "name-filter", type: "search", placeholder: "name contains…",
    value: query.get("name") ?? "",
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
  const prev = h("button", { id: "prev-page", type: "button" }, "← Newer");
  const next = h("button", { id: "next-page", type: "button" }, "Older →");
  const compare = h("button", { id: "compare-selected", type: "button" }, "Compare selected");
  const cursors = [null]; // cursors[i] fetches page i
  let pageIndex = 0;
  let nextCursor = null;
  const picked = new Set();
  let sortKey = null;
  let sortDir = 1;
  const header = (label, key, cls) => {
    const th = h("th", { class: cls, dataset: key ? { sort: key } : {} }, label);
    if (key) {
      th.classList.add("sortable");
      th.addEventListener("click", () => {
        sortDir = sortKey === key ? -sortDir : 1;
        sortKey = key;
        for (const other of th.parentNode.children) other.removeAttribute("aria-sort");
        th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
        stop.now();
      });
    }
    return th;
  };

  async function load() {
    const page = await api("/v1/jobs", {
      query: {
        state: stateSel.value || undefined, name: nameInput.value.trim() || undefined,
        limit: PAGE_SIZE, cursor: cursors[pageIndex] ?? undefined,
      },
    });
    nextCursor = page.next_cursor;
    body.replaceChildren(...sorted(page.items, sortKey, sortDir).map(jobRow));
    for (const box of body.querySelectorAll("input.pick")) {
      box.checked = picked.has(box.value);
      box.addEventListener("change", () => {
        if (box.checked) picked.add(box.value); else picked.delete(box.value);
      });
    }
    if (!page.items.length) {
      body.append(h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No jobs match.")));
    }
    info.textContent = `page ${pageIndex + 1} · ${page.items.length} jobs`;
    prev.disabled = pageIndex === 0;
    next.disabled = !nextCursor;
    root.dataset.loaded = "true";
  }

  let stop = poll(load, REFRESH_MS);
  const restart = () => { stop(); stop = poll(load, REFRESH_MS); };
  const refilter = () => { cursors.length = 1; pageIndex = 0; restart(); };
  stateSel.addEventListener("change", refilter);
  let typing = null;
  nameInput.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(refilter, 250); });
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
    h("div", { class: "toolbar" }, stateSel, nameInput, info, h("span", { class: "spacer" }),
      compare, h("a", { href: "#/submit" }, h("button", { class: "primary", type: "button" }, "New job"))),
    h("table", { id: "jobs-table" },
      h("thead", {}, h("tr", {},
        header("id", "id", "num"), header("name", "name"), header("state", "state"),
        header("strategy"), header("nodes × procs", null, "num"),
        header("progress", "progress", "num"), header("loss", "loss", "num"),
        header("created", "created"), header("duration", "duration", "num"), header("cmp"))),
      body),
    h("div", { class: "pager" }, prev, next));
  return () => { stop(); clearTimeout(typing); };
}
