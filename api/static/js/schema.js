// What GET /v1/spec/schema says about the field under the editor's cursor: its type, bounds,
// default and description. Validation itself is the API's (POST /v1/spec/validate).

function resolve(schema, root) {
  let s = schema;
  while (s && s.$ref) s = s.$ref.replace(/^#\//, "").split("/").reduce((n, k) => n?.[k], root);
  return s ?? {};
}

function alternatives(schema, root) {
  const s = resolve(schema, root);
  return [s, ...(s.anyOf ?? s.oneOf ?? []).map((a) => resolve(a, root))];
}

/** The schema of the field at `path` (keys; numbers step into list items), or null. */
export function fieldSchema(root, path) {
  let field = root;
  for (const part of path) {
    let next = null;
    for (const alt of alternatives(field, root)) {
      if (typeof part === "number" && alt.items) next = alt.items;
      else if (alt.properties && part in alt.properties) next = alt.properties[part];
      else if (typeof alt.additionalProperties === "object") next = alt.additionalProperties;
      if (next) break;
    }
    if (!next) return null;
    field = next;
  }
  return field;
}

/** One line about `field`: "integer ≥ 1 · default 8 · Sequences per rank per micro-step." */
export function describe(field, root) {
  const alts = alternatives(field, root).filter((a) => a.type || a.enum || "const" in a);
  const kinds = alts.map((a) => {
    if (a.enum) return a.enum.map((e) => JSON.stringify(e)).join(" | ");
    if ("const" in a) return JSON.stringify(a.const);
    const bounds = [
      a.minimum !== undefined ? `≥ ${a.minimum}` : "", a.exclusiveMinimum !== undefined ? `> ${a.exclusiveMinimum}` : "",
      a.maximum !== undefined ? `≤ ${a.maximum}` : "", a.exclusiveMaximum !== undefined ? `< ${a.exclusiveMaximum}` : "",
    ].filter(Boolean).join(" ");
    // A spec section is an object whose title is the model's class name: say "section".
    return [a.type === "object" && a.title ? "section" : a.type, bounds].filter(Boolean).join(" ");
  });
  const s = resolve(field, root);
  const parts = [[...new Set(kinds)].join(" or ")];
  if ("default" in field) parts.push(`default ${JSON.stringify(field.default)}`);
  parts.push(field.description ?? s.description ?? "");
  return parts.filter(Boolean).join(" · ");
}

const KEY = /^(\s*)(- +)?("(?:[^"\\]|\\.)*"|'[^']*'|[^\s#'"{[\]}:,-][^#:]*?)\s*:(\s|$)/;

/**
 * The JSON path of the key written on line `n` (0-based) of block-style YAML `lines`, from
 * indentation (enough for field help; the API's parser is the authority). [] when none.
 */
export function pathAtLine(lines, n) {
  const path = [];
  let indent = Infinity;
  for (let i = Math.min(n, lines.length - 1); i >= 0 && indent > 0; i -= 1) {
    const m = KEY.exec(lines[i]);
    if (!m) continue;
    const at = m[1].length + (m[2]?.length ?? 0);
    if (at >= indent) continue;
    const key = m[3].replace(/^["']|["']$/g, "");
    path.unshift(key);
    indent = m[2] ? m[1].length : at;
  }
  return path;
}
