"""Every problem of a submitted job spec in one answer.

pydantic reports the field errors of a spec and stops there: the rules across fields
(`jobspec.checks`) run only on a spec whose fields all validate, so a spec with a bad field and a
broken rule took two rounds of fix-and-resubmit (issue 28). `spec_errors` reports both: the
field errors, then the cross-field conflicts of the spec with those fields repaired as
`jobspec.stored` repairs them (an unknown or invalid field dropped so its default applies, a
missing one filled), leaving out a conflict at a field already reported. It also returns that
repaired spec, so the server can check its references (datasets, code, `init_from`) in the same
answer. An unknown field says which known one it most likely meant, and so does a value that is
not one of a field's choices (`strategy: dpp`: did you mean `ddp`?); a name that breaks its
pattern says in words what a name may hold instead of quoting the regular expression. The
problems come in the order of the fields in the spec as written (a YAML file's line order).

Pure pydantic (and the standard library's `difflib`).
"""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from jobspec.entrypoint import CODE_ID_PATTERN, PARAM_NAME
from jobspec.evaluate import EVAL_NAME
from jobspec.inputs import INPUT_NAME, SHA256
from jobspec.job import NAME_FIELD_PATTERN, SPEC_MODELS, AnySpec, JobSpec, parse_job_spec, spec_kind
from jobspec.stored import repair

# Names from other trainers that mean one of ours (TRL, transformers, the OpenAI API); a typo
# of one of ours is found by `difflib` instead.
SYNONYMS = {
    "learning_rate": "lr",
    "batch_size": "micro_batch_size",
    "per_device_train_batch_size": "micro_batch_size",
    "gradient_accumulation_steps": "grad_accum_steps",
    "num_train_epochs": "epochs",
    "n_epochs": "epochs",
    "max_seq_length": "seq_len",
    "max_length": "seq_len",
    "warmup": "warmup_steps",
    "lora_r": "r",
    "rank": "r",
    "lora_alpha": "alpha",
    "world_size": "procs_per_node",
    "gpus": "procs_per_node",
    "eval_steps": "interval_steps",
    "save_steps": "interval_steps",
    "logging_steps": "log_interval_steps",
}
_MAX_REPAIRS = 8
# What each of the spec's name patterns allows, in words (pydantic quotes the regex).
PATTERN_WORDS = {
    NAME_FIELD_PATTERN: "letters, digits, '.', '_' and '-', starting with a letter or digit",
    INPUT_NAME: "lower-case letters, digits and '_', starting with a letter (at most 63)",
    SHA256: "a sha256: 64 lower-case hexadecimal digits",
    CODE_ID_PATTERN: "an uploaded code archive's id: `code_` and 16 hexadecimal digits",
    PARAM_NAME: "letters, digits, '_', '.' and '-', starting with a letter or '_'",
    EVAL_NAME: "a letter, then letters, digits, '_' and '-' (at most 40)",
}
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")
_LAST = (10**9,)  # the place of a field the spec does not have: after those it has


@dataclass
class SpecErrors:
    """`errors`: pydantic-style dicts (`loc` without `body`, `msg`, `type`), fields first;
    `repaired`: the spec with every problem repaired (each bad field's default used; None when
    it could not be read), whose references a server can check next."""

    errors: list[dict[str, Any]] = field(default_factory=list)
    repaired: AnySpec | None = None


def spec_errors(data: Any) -> SpecErrors:
    """Every field and cross-field problem of `data` (a job spec as submitted); no errors and
    the parsed spec when it is valid."""
    try:
        return SpecErrors(repaired=parse_job_spec(data))
    except ValidationError as exc:
        first = exc.errors()
    model = SPEC_MODELS[spec_kind(data)] if isinstance(data, dict) else JobSpec
    errors = [_hinted(e, model) for e in first]
    if not isinstance(data, dict):
        return SpecErrors(errors)
    reported = {tuple(e["loc"]) for e in errors}
    repaired = copy.deepcopy(data)
    conflicts_seen = False
    fixed: AnySpec | None = None
    for _ in range(_MAX_REPAIRS):
        try:
            fixed = parse_job_spec(repaired)
            break
        except ValidationError as exc:
            found = exc.errors()
            if not conflicts_seen and all(e["type"] == "spec_conflict" for e in found):
                # the rules the field errors hid; then repaired too, for the references' sake
                conflicts_seen = True
                errors += [dict(e) for e in found if not _covered(tuple(e["loc"]), reported)]
            if not repair(repaired, exc, [], None):
                break
    errors.sort(key=lambda e: spec_order(data, e["loc"]))
    return SpecErrors(errors, fixed)


def spec_order(data: Any, loc: Any) -> tuple[int, ...]:
    """Where the field at `loc` is written in `data` (the key order of each mapping, as
    parsed from the file's lines); a field it lacks sorts after its section's own."""
    place, node = [], data
    for part in loc:
        if isinstance(node, dict) and part in node:
            place.append(list(node).index(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            place.append(part)
            node = node[part]
        else:
            return (*place, *_LAST)
    return tuple(place)


def _covered(loc: tuple[Any, ...], reported: set[tuple[Any, ...]]) -> bool:
    """Whether a conflict at `loc` is about a field already reported (or inside one)."""
    return any(loc[: len(r)] == r or r[: len(loc)] == loc for r in reported)


def _hinted(error: Any, model: type[BaseModel]) -> dict[str, Any]:
    """`error` as a dict; an unknown field's message names the field it most likely meant."""
    out = {k: error[k] for k in ("loc", "msg", "type", "input") if k in error}
    ctx = error.get("ctx") or {}
    if error["type"] == "string_pattern_mismatch" and ctx.get("pattern") in PATTERN_WORDS:
        out["msg"] = f"should be {PATTERN_WORDS[ctx['pattern']]}; got {error['input']!r}"
        return out
    if error["type"] in ("literal_error", "enum") and isinstance(error.get("input"), str):
        choices = _QUOTED.findall(str(ctx.get("expected", "")))
        close = difflib.get_close_matches(error["input"], choices, n=1, cutoff=0.6)
        if close:
            out["msg"] = f"{error['msg']}; did you mean `{close[0]}`?"
        return out
    if error["type"] != "extra_forbidden":
        return out
    *parents, name = error["loc"]
    section = _section(model, parents)
    if section is None:
        return out
    known = list(section.model_fields)
    guess = SYNONYMS.get(str(name))
    if guess not in known:
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
        guess = close[0] if close else None
    where = ".".join(str(p) for p in parents)
    if guess is not None:
        out["msg"] = f"unknown field; did you mean `{'.'.join([*map(str, parents), guess])}`?"
    else:
        out["msg"] = f"unknown field of {where or 'the spec'} (its fields: {', '.join(known)})"
    return out


def _section(model: type[BaseModel], parents: list[Any]) -> type[BaseModel] | None:
    """The spec section (model) at `parents`, or None when a part is not a section."""
    current: type[BaseModel] = model
    for part in parents:
        info = current.model_fields.get(str(part))
        if info is None:
            return None
        found = next(
            (
                a
                for a in (info.annotation, *get_args(info.annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if found is None:
            return None
        current = found
    return current
