// The dashboard's shell: sign-in, navigation and a hash router (#/jobs, #/jobs/7, ...).

import { api, auth, loginHash } from "./api.js";
import { clearError, h } from "./util.js";
import { jobsPage } from "./jobs.js";
import { detailPage } from "./detail.js";
import { comparePage } from "./compare.js";
import { submitPage } from "./submit.js";
import { datasetPage, datasetsPage } from "./datasets.js";
import { usagePage } from "./usage.js";
import { sessionPage, sessionsPage } from "./sessions.js";
import { sweepPage, sweepsPage } from "./sweeps.js";
import { settingsPage } from "./settings.js";

let view = document.getElementById("view");
let stopPage = null;

/** Where a deep link pointed: `#/login?next=/jobs/7` -> `#/jobs/7`; else the jobs list. */
function afterLogin(query) {
  const next = query.get("next");
  return next && next.startsWith("/") && !next.startsWith("/login") ? `#${next}` : "#/jobs";
}

function loginPage(root, query) {
  const input = h("input", {
    id: "api-key", type: "password", autocomplete: "off", placeholder: "ty_...",
    required: true,
  });
  const message = h("p", { id: "login-error", class: "muted" });
  const remember = h("input", { id: "remember-key", type: "checkbox" });
  const form = h("form", { class: "panel login", onsubmit: async (event) => {
    event.preventDefault();
    try {
      await api("/v1/me", { key: input.value.trim() });
    } catch (err) {
      message.textContent = err.status === 401 ? "That key is not valid." : err.message;
      return;
    }
    auth.keep(input.value.trim(), remember.checked);
    window.location.hash = afterLogin(query);
  } },
  h("h1", {}, "Sign in"),
  h("label", { for: "api-key" }, "API key"),
  input,
  h("label", { class: "remember" }, remember, " Remember on this browser"),
  h("button", { class: "primary", type: "submit" }, "Sign in"),
  message,
  h("p", { class: "muted" }, "Unless remembered, the key is kept for this tab only "
    + "(sessionStorage); remembered, in this browser until you log out (localStorage)."));
  root.append(form);
  input.focus();
}

async function showWho() {
  try {
    const me = await api("/v1/me");
    document.getElementById("who").textContent = `${me.project.name} · ${me.key.prefix}…`;
  } catch { /* a 401 already sent us to the sign-in page */ }
}

function route() {
  if (stopPage) { stopPage(); stopPage = null; }
  clearError();
  // A fresh <main> per page: a poll of the page left behind that resolves late writes into the
  // old, detached element, never marking the new page loaded (data-loaded, live, zoom) or
  // filling it with its rows (a sweep page once read as loaded before its chart existed).
  const fresh = view.cloneNode(false);
  for (const key of Object.keys(fresh.dataset)) delete fresh.dataset[key];
  view.replaceWith(fresh);
  view = fresh;
  const [path, queryString] = window.location.hash.replace(/^#/, "").split("?");
  const query = new URLSearchParams(queryString ?? "");
  const signedIn = Boolean(auth.key);
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("logout").hidden = !signedIn;
  if (!signedIn || path === "/login") {
    document.getElementById("who").textContent = "";
    if (signedIn) { window.location.hash = afterLogin(query); return; }
    if (path !== "/login") { // a deep link: sign in first, then land where it pointed
      history.replaceState(null, "", loginHash());
      route();
      return;
    }
    loginPage(view, query);
    return;
  }
  showWho();
  const parts = path.split("/").filter(Boolean);
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.nav === (parts[0] ?? "jobs"));
  }
  if (parts[0] === "jobs" && parts[1]) stopPage = detailPage(view, Number(parts[1]), query);
  else if (parts[0] === "compare") stopPage = comparePage(view, query);
  else if (parts[0] === "submit") stopPage = submitPage(view, query);
  else if (parts[0] === "datasets" && parts[1]) stopPage = datasetPage(view, parts[1]);
  else if (parts[0] === "datasets") stopPage = datasetsPage(view);
  else if (parts[0] === "sweeps" && parts[1]) stopPage = sweepPage(view, Number(parts[1]));
  else if (parts[0] === "sweeps") stopPage = sweepsPage(view);
  else if (parts[0] === "sessions" && parts[1]) stopPage = sessionPage(view, decodeURIComponent(parts[1]));
  else if (parts[0] === "sessions") stopPage = sessionsPage(view);
  else if (parts[0] === "usage") stopPage = usagePage(view);
  else if (parts[0] === "settings") stopPage = settingsPage(view, parts[1]);
  else stopPage = jobsPage(view, query);
}

// The control plane's own health (GET /readyz): a banner while no controller reconciles, since
// lost workers' jobs are then not requeued and hung attempts not ended, and nothing else says so.
const CONTROL_CHECK_MS = 15_000;

async function checkControl() {
  const banner = document.getElementById("control-banner");
  let reconciler;
  try {
    const answer = await fetch(new URL("/readyz", window.location.origin));
    reconciler = (await answer.json()).reconciler;
  } catch {
    return; // the API is unreachable or not ready: the pages' own requests say so
  }
  banner.hidden = !reconciler || reconciler.state === "ok";
  banner.dataset.state = reconciler?.state ?? "";
  if (!banner.hidden) {
    banner.textContent = `Reconciler ${reconciler.state}: ${reconciler.detail}`;
  }
}

checkControl();
setInterval(checkControl, CONTROL_CHECK_MS);

document.getElementById("logout").addEventListener("click", () => {
  // The page stops polling before the key goes: a tick between now and the hash change would
  // otherwise ask the API without a key (401s in the console).
  if (stopPage) { stopPage(); stopPage = null; }
  auth.key = null;
  window.location.hash = "#/login";
});
window.addEventListener("hashchange", route);
route();
