// A job's summary card: final and best losses, tokens seen, throughput, MFU, the generated
// sample and the hyperparameters; and the labels and note a user edits (PATCH /v1/jobs/{id}).
//
// Where each number comes from: `loss` / `eval_loss` the job's `latest_metrics` (final) and
// `best_loss` / `best_eval_loss` (kept at ingest); tokens seen = the trainer's
// `tokens_per_step` (its `running` report) x `current_step`; throughput the run's average
// tokens/s of the `completed` report, else the last interval's `tokens_per_second`; MFU the
// trainer's own `mfu` metric: tokens/s x (6 N + 12 L d T) / (world size x the GPU's peak bf16
// FLOP/s), reported only on a GPU whose peak it knows (none on CPU), so omitted otherwise.

import { api } from "./api.js";
import { TERMINAL, fmtNumber, fmtRate, h, showError } from "./util.js";

const HYPER_SECTIONS = ["model", "train", "optim"];

/** {"n_layers": 2, "lr": 3e-4, ...} flattened as [["model.n_layers", 2], ...]. */
function flatten(prefix, value) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    return Object.entries(value).flatMap(([k, v]) => flatten(`${prefix}.${k}`, v));
  }
  return [[prefix, Array.isArray(value) ? value.join(", ") : value]];
}

function hyperRows(spec) {
  return HYPER_SECTIONS.filter((s) => spec?.[s]).flatMap((s) => flatten(s, spec[s]))
    .filter(([, v]) => v !== null && v !== undefined);
}

/** Labels typed as `key=value` pairs (comma or space separated) as an object; throws on a pair
 * without `=`. */
export function parseLabels(text) {
  const labels = {};
  for (const pair of text.split(/[,\s]+/).filter(Boolean)) {
    const at = pair.indexOf("=");
    if (at <= 0) throw new Error(`"${pair}" is not key=value`);
    labels[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return labels;
}

const labelsText = (labels) => Object.entries(labels ?? {}).map(([k, v]) => `${k}=${v}`).join(", ");

export function summaryCard(jobId, onSaved) {
  const stats = h("dl", { class: "stats", id: "run-stats" });
  const sample = h("div", { id: "run-sample", hidden: true });
  const hyper = h("dl", { class: "hparams", id: "hparams" });
  const labelsInput = h("input", { id: "labels-input", type: "text", "aria-label": "labels",
    placeholder: "team=nlp, baseline=yes" });
  const noteInput = h("textarea", { id: "note-input", rows: 2, "aria-label": "note",
    placeholder: "a note about this run…" });
  const save = h("button", { id: "save-details", type: "submit" }, "Save");
  const status = h("span", { id: "details-status", class: "muted", role: "status" });
  const form = h("form", { class: "details-form", id: "job-details" },
    h("label", { for: "labels-input" }, "labels"), labelsInput,
    h("label", { for: "note-input" }, "note"), noteInput,
    h("div", { class: "details-actions" }, save, status));
  let runInfo = {}; // the trainer's latest `running` report (tokens_per_step, num_params)
  let completed = null; // its `completed` report (run average tokens/s, final losses)
  let sampleEvent = null;
  let job = null;
  let filled = false;
  let dirty = false;
  // What the form says now, and what it said when its last answer came: an `input` event that
  // changes nothing (a late one of the edit just saved) keeps that answer on screen.
  const formText = () => JSON.stringify([labelsInput.value, noteInput.value]);
  let answered = null;
  const say = (state, text) => { status.dataset.state = state; status.textContent = text; };
  for (const input of [labelsInput, noteInput]) {
    input.addEventListener("input", () => {
      dirty = true;
      if (formText() !== answered) say("", "");
    });
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let labels;
    const sent = formText();
    try {
      labels = parseLabels(labelsInput.value);
    } catch (err) {
      answered = sent;
      say("error", err.message);
      return;
    }
    save.disabled = true;
    say("saving", "saving…");
    try {
      const updated = await api(`/v1/jobs/${jobId}`, {
        method: "PATCH", body: { labels, note: noteInput.value },
      });
      dirty = false;
      filled = false;
      answered = sent;
      say("saved", "saved");
      onSaved(updated);
    } catch (err) {
      const where = err.details?.map((d) => `${d.loc.slice(1).join(".")}: ${d.msg}`).join("; ");
      answered = sent;
      say("error", where || err.message);
      if (err.status !== 422) showError(err);
    } finally {
      save.disabled = false;
    }
  });

  function stat(key, label, value, title) {
    return h("div", { title: title ?? "" }, h("dt", {}, label),
      h("dd", { dataset: { stat: key } }, value));
  }

  function render() {
    if (!job) return;
    const m = job.latest_metrics ?? {};
    const perStep = runInfo.tokens_per_step;
    const tokensPerSecond = completed?.tokens_per_second ?? m.tokens_per_second;
    // "final" once the job has ended; while it runs the value is its latest
    const last = TERMINAL.has(job.state) ? "final" : "latest";
    // A GRPO run's loss is ~0 by construction and its eval loss is -eval_reward: its rewards
    // are what it is read by (the best eval reward is -best_eval_loss, kept at ingest).
    const losses = typeof m.reward === "number" ? [
      stat("final_reward", `${last} reward`, fmtNumber(m.reward), "mean over the step's sampled completions"),
      stat("final_eval_reward", `${last} eval reward`, fmtNumber(m.eval_reward),
        "mean over the held-out prompts, one greedy completion each"),
      stat("best_eval_reward", "best eval reward",
        typeof job.best_eval_loss === "number" ? fmtNumber(-job.best_eval_loss) : "–"),
    ] : [
      stat("final_loss", `${last} train loss`, fmtNumber(m.loss)),
      stat("best_loss", "best train loss", fmtNumber(job.best_loss)),
      stat("final_eval_loss", `${last} eval loss`, fmtNumber(m.eval_loss)),
      stat("best_eval_loss", "best eval loss", fmtNumber(job.best_eval_loss)),
    ];
    const rows = [
      ...losses,
      stat("tokens_seen", "tokens seen",
        perStep && job.current_step ? fmtNumber(perStep * job.current_step) : "–",
        "tokens per optimizer step (all ranks) × steps done"),
      stat("throughput", "throughput",
        tokensPerSecond ? `${fmtRate(tokensPerSecond)} tokens/s` : "–",
        completed ? "the whole run's average" : "the last logging interval"),
    ];
    if (typeof m.mfu === "number") {
      rows.push(stat("mfu", "MFU", `${(m.mfu * 100).toFixed(1)} %`,
        "tokens/s × (6·N + 12·L·d·T) FLOPs per token / (world size × the GPU's peak bf16 FLOP/s)"));
    }
    if (runInfo.num_params) rows.push(stat("params", "parameters", fmtNumber(runInfo.num_params)));
    // A figure the run has not reported (yet, or ever: a crashed run) is left out, not shown
    // as a dash; with none the row is hidden.
    const known = rows.filter((row) => row.querySelector("dd").textContent !== "–");
    stats.replaceChildren(...known);
    node.hidden = !known.length;
    const group = sampleEvent?.data?.samples;
    if (Array.isArray(group) && group.length) { // a GRPO step's completions of one prompt
      sample.hidden = false;
      sample.replaceChildren(
        h("div", { class: "muted tail-title" },
          `Completions at step ${sampleEvent.data?.step ?? "?"}, with their rewards; prompt`),
        h("pre", { class: "sample-text" }, sampleEvent.data?.prompt ?? ""),
        h("table", { class: "samples", id: "run-samples" },
          h("thead", {}, h("tr", {}, h("th", {}, "completion"), h("th", {}, "reward"))),
          h("tbody", {}, ...group.map((one) => h("tr", {},
            h("td", {}, h("pre", { class: "sample-text" }, String(one.completion ?? ""))),
            h("td", { class: "num", dataset: { reward: String(one.reward) } },
              fmtNumber(one.reward)))))));
    } else if (sampleEvent) {
      sample.hidden = false;
      sample.replaceChildren(
        h("div", { class: "muted tail-title" },
          `Sample at step ${sampleEvent.data?.step ?? "?"}, prompt “${sampleEvent.data?.prompt ?? ""}”`),
        h("pre", { class: "sample-text" }, sampleEvent.data?.text ?? ""));
    }
    if (!hyper.childElementCount) { // a script job's spec has none: no empty box
      const params = hyperRows(job.spec);
      hyperBox.hidden = !params.length;
      hyper.replaceChildren(...params.map(([k, v]) => h("div", {},
        h("dt", {}, k), h("dd", { dataset: { param: k } }, String(v)))));
    }
    if (!filled && !dirty) {
      labelsInput.value = labelsText(job.labels);
      noteInput.value = job.note ?? "";
      filled = true;
    }
  }

  const hyperBox = h("details", { id: "hparams-box", open: true },
    h("summary", {}, "Hyperparameters"), hyper);
  // The figures lead the page, above the charts; the rest sits in the page's Overview.
  const node = h("section", { class: "panel summary-card", id: "summary-card" }, stats);
  const details = h("section", { class: "panel summary-card", id: "summary-details" },
    sample, form, hyperBox);
  return {
    node,
    details,
    /** The job as last read. */
    job(next) { job = next; render(); },
    /** New events, oldest first: the trainer's reports and samples. */
    events(items) {
      for (const e of items) {
        const data = e.data ?? {};
        if (data.tokens_per_step !== undefined) runInfo = data;
        if (data.trainer_state === "completed") completed = data;
        // the latest sample; a GRPO run's graded group (`samples`) over its final plain one
        if (e.kind === "sample" && (e.data?.samples || !sampleEvent?.data?.samples)) sampleEvent = e;
      }
      render();
    },
  };
}
