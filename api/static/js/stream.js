// A job's server-sent events (GET /v1/jobs/{id}/stream), read with fetch so the request can
// carry `Authorization: Bearer` (EventSource cannot). Reconnects with `Last-Event-ID`.

import { auth } from "./api.js";

const RETRY_MS = 1000;
const MAX_FAILURES = 3;

function parseBlock(block) {
  const message = { event: "message", data: [], id: null };
  for (const line of block.split(/\r?\n/)) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") message.event = value;
    else if (field === "data") message.data.push(value);
    else if (field === "id") message.id = value;
  }
  return message.data.length ? { ...message, data: message.data.join("\n") } : null;
}

/**
 * Follow `path`: `onMessage({event, data, id})` for each message, `onEnd()` after `end`,
 * `onFail(err)` once it gave up (the caller then polls). Returns a function that stops it.
 */
export function follow(path, { lastEventId = null, onMessage, onEnd, onFail }) {
  const abort = new AbortController();
  let lastId = lastEventId;
  let failures = 0;
  (async () => {
    while (!abort.signal.aborted) {
      try {
        const headers = { Authorization: `Bearer ${auth.key}`, Accept: "text/event-stream" };
        if (lastId) headers["Last-Event-ID"] = lastId;
        const answer = await fetch(path, { headers, signal: abort.signal, cache: "no-store" });
        if (!answer.ok || !answer.body) throw new Error(`stream answered HTTP ${answer.status}`);
        const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          failures = 0;
          buffer += value;
          let cut;
          while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
            const message = parseBlock(buffer.slice(0, cut));
            buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
            if (!message) continue;
            if (message.id !== null) lastId = message.id;
            if (message.event === "end") { onEnd?.(message); return; }
            onMessage(message);
          }
        }
      } catch (err) {
        if (abort.signal.aborted) return;
        failures += 1;
        if (failures >= MAX_FAILURES) { onFail?.(err); return; }
      }
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  })();
  return () => abort.abort();
}
