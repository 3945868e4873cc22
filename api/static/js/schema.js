// Checks a value against the subset of JSON Schema that pydantic emits for JobSpec ($ref,
// anyOf, type, const, enum, bounds, lengths, pattern, required, properties,
// additionalProperties, items), for hints while typing. The API's 422 stays the authority.

const TYPES = {
  integer: Number.isInteger,
  number: (v) => typeof v === "number",
  string: (v) => typeof v === "string",
  boolean: (v) => typeof v === "boolean",
  null: (v) => v === null,
  array: Array.isArray,
  object: (v) => v !== null && typeof v === "object" && !Array.isArray(v),
};

function resolve(schema, root) {
  let s = schema;
  while (s && s.$ref) s = s.$ref.replace(/^#\//, "").split("/").reduce((n, k) => n?.[k], root);
  return s ?? {};
}

/** Problems of `value` under `schema`: [{path: [...], msg}]. */
export function validate(value, schema, root = schema, path = []) {
  const s = resolve(schema, root);
  const alternatives = s.anyOf ?? s.oneOf;
  if (alternatives) {
    const results = alternatives.map((alt) => validate(value, alt, root, path));
    if (results.some((r) => !r.length)) return [];
    return results.reduce((best, r) => (r.length < best.length ? r : best));
  }
  const out = [];
  const add = (msg) => out.push({ path, msg });
  if (s.type && !(Array.isArray(s.type) ? s.type : [s.type]).some((t) => TYPES[t]?.(value))) {
    add(`should be ${Array.isArray(s.type) ? s.type.join(" or ") : s.type}`);
    return out;
  }
  if ("const" in s && value !== s.const) add(`should be ${JSON.stringify(s.const)}`);
  if (s.enum && !s.enum.includes(value)) add(`should be one of ${s.enum.map((e) => JSON.stringify(e)).join(", ")}`);
  if (typeof value === "number") {
    if (s.minimum !== undefined && value < s.minimum) add(`should be ≥ ${s.minimum}`);
    if (s.maximum !== undefined && value > s.maximum) add(`should be ≤ ${s.maximum}`);
    if (s.exclusiveMinimum !== undefined && value <= s.exclusiveMinimum) add(`should be > ${s.exclusiveMinimum}`);
    if (s.exclusiveMaximum !== undefined && value >= s.exclusiveMaximum) add(`should be < ${s.exclusiveMaximum}`);
  }
  if (typeof value === "string") {
    if (s.minLength !== undefined && value.length < s.minLength) add(`should have at least ${s.minLength} characters`);
    if (s.maxLength !== undefined && value.length > s.maxLength) add(`should have at most ${s.maxLength} characters`);
    if (s.pattern && !new RegExp(s.pattern, "u").test(value)) add(`should match ${s.pattern}`);
  }
  if (Array.isArray(value) && s.items) {
    value.forEach((v, i) => out.push(...validate(v, s.items, root, [...path, i])));
  }
  if (TYPES.object(value)) {
    for (const key of s.required ?? []) {
      if (!(key in value)) out.push({ path: [...path, key], msg: "is required" });
    }
    const props = s.properties ?? {};
    for (const [key, v] of Object.entries(value)) {
      if (key in props) out.push(...validate(v, props[key], root, [...path, key]));
      else if (s.additionalProperties === false) out.push({ path: [...path, key], msg: "is not a field here" });
      else if (typeof s.additionalProperties === "object") {
        out.push(...validate(v, s.additionalProperties, root, [...path, key]));
      }
    }
  }
  return out;
}
