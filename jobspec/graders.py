"""Graders of reinforcement fine-tuning: how a sampled completion is scored, in the JSON shapes of
OpenAI's reinforcement fine-tuning graders (https://platform.openai.com/docs/api-reference/graders):
`string_check`, `text_similarity`, `python` and `multi`, a union discriminated on `type`.

A GRPO spec holds `graders: Graders` (a list of `Grader`, each named once, each with a `weight`);
`trainer.graders` builds and runs them. Every score is a float in [0, 1] for the built-in graders,
and whatever finite number a `python` grader's `grade()` returns.

Refused here, at validation, rather than at run time (each with a message that says why):

- `score_model` and `label_model` graders are left out of the union: a `BeforeValidator` refuses
  them by their `type` with their own message ("... need a registered grader model; none is
  available"), so the JSON Schema offers only graders that can run.
- `text_similarity` metrics `meteor` (needs NLTK's WordNet corpus, which workers cannot download)
  and `cosine` (needs an embedding model) are refused at `evaluation_metric`.
- A `multi` grader's `calculate_output` is parsed with Python's `ast` and may hold only its
  graders' names, numbers, `+ - * / **`, unary `-`/`+`, parentheses and `min`, `max`, `abs`
  (`parse_formula`); anything else is refused with its column. `evaluate_formula` computes it
  with the same whitelist, in floats (so `9 ** 9 ** 9` overflows at once instead of building a
  huge integer).

Imports nothing heavier than pydantic (templates are Jinja2, compiled by the trainer: the API
does not install Jinja2).
"""

from __future__ import annotations

import ast
import difflib
import keyword
import math
import operator
from collections.abc import Callable, Collection, Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from jobspec.base import StrictSpec

GRADER_NAME: Final = r"^[A-Za-z][A-Za-z0-9_-]{0,39}$"
GraderName = Annotated[str, Field(pattern=GRADER_NAME)]
# A multi grader's keys are the names its formula uses: identifiers.
FORMULA_NAME: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,39}$"
Template = Annotated[str, Field(min_length=1, max_length=4000)]
TEMPLATE_HELP: Final = (
    "A Jinja2 template over `sample` (the completion: `sample.output_text`) and `item` (the "
    "dataset record), e.g. `{{ sample.output_text }}`; a field the record lacks is an error. "
    "Not stripped: use `| trim` to ignore surrounding whitespace."
)
NAME_HELP: Final = (
    "Names the grader's score in metrics: a letter, then letters, digits, '_' or '-' (at most 40)."
)
WEIGHT_HELP: Final = (
    "Weight of this grader's score in the reward (the weighted sum over the list); 0 logs the "
    "score without training on it. Unused inside a `multi` grader, whose formula weighs."
)

# Graders that need a model the platform does not have: refused by `type`, with this reason.
MODEL_GRADERS: Final = {
    "score_model": "score_model graders need a registered grader model; none is available",
    "label_model": "label_model graders need a registered grader model; none is available",
}
# Metrics OpenAI offers that cannot run on a worker, with the reason.
UNAVAILABLE_METRICS: Final = {
    "meteor": "meteor needs NLTK's WordNet corpus, which workers cannot download (no network); "
    "use rouge_l, bleu or gleu",
    "cosine": "cosine needs an embedding model, and none is registered; use fuzzy_match, bleu "
    "or rouge_l",
}
SimilarityMetric = Literal[
    "fuzzy_match",
    "bleu",
    "gleu",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
]


class _GraderBase(StrictSpec):
    name: GraderName = Field(description=NAME_HELP)
    weight: float = Field(default=1.0, allow_inf_nan=False, description=WEIGHT_HELP)


class StringCheckGrader(_GraderBase):
    """1.0 when the rendered `input` and `reference` compare as `operation` says, else 0.0."""

    type: Literal["string_check"] = Field(description="`string_check`.")
    input: Template = Field(description=f"The text checked. {TEMPLATE_HELP}")
    reference: Template = Field(description=f"The text it is checked against. {TEMPLATE_HELP}")
    operation: Literal["eq", "ne", "like", "ilike"] = Field(
        description="`eq`: equal; `ne`: not equal; `like`: `reference` is a substring of "
        "`input` (case-sensitive); `ilike`: the same, ignoring case (Unicode case folding)."
    )


class TextSimilarityGrader(_GraderBase):
    """The similarity of the rendered `input` to `reference`, in [0, 1], by a well-known metric
    computed locally (`trainer.graders` names the library of each)."""

    type: Literal["text_similarity"] = Field(description="`text_similarity`.")
    input: Template = Field(description=f"The text scored. {TEMPLATE_HELP}")
    reference: Template = Field(description=f"The text it is compared with. {TEMPLATE_HELP}")
    evaluation_metric: SimilarityMetric = Field(
        description="`fuzzy_match`: normalized Indel similarity (rapidfuzz `fuzz.ratio` / 100); "
        "`bleu`: sentence BLEU (sacrebleu, / 100); `gleu`: Google-BLEU (NLTK `sentence_gleu`, "
        "whitespace tokens); `rouge_1`..`rouge_5`, `rouge_l`: ROUGE-N / ROUGE-L F1 "
        "(`rouge-score`, its lower-casing ASCII tokenizer). `meteor` and `cosine` are refused: "
        "workers have neither WordNet nor an embedding model."
    )
    pass_threshold: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="A sample passes when its score is at least this (counted as `passed` in "
        "the grader's metrics); the score, the reward, is unchanged. null: no pass count.",
    )

    @field_validator("evaluation_metric", mode="before")
    @classmethod
    def _metric_can_run(cls, value: Any) -> Any:
        if isinstance(value, str) and value in UNAVAILABLE_METRICS:
            raise PydanticCustomError("grader_metric_unavailable", UNAVAILABLE_METRICS[value])
        return value


class PythonGrader(_GraderBase):
    """The team's `grade(sample: dict, item: dict) -> float`, from inline `source` or a `file` of
    the job's code directory, run in a child process of its own with `timeout_s` per call."""

    type: Literal["python"] = Field(description="`python`.")
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="Python source that defines `grade(sample, item)` at top level, returning "
        "a number. Give `source` or `file`.",
    )
    file: str | None = Field(
        default=None,
        min_length=1,
        max_length=300,
        description="A `.py` file of the job's code directory (`path/to/file.py`, relative, no "
        "`..`) that defines `grade(sample, item)`. Give `source` or `file`.",
    )
    timeout_s: float = Field(
        default=5.0,
        gt=0.0,
        le=60.0,
        description="Seconds one call may take; past it the process is restarted and the "
        "sample scores 0 (counted as a timeout).",
    )

    @field_validator("source")
    @classmethod
    def _source_defines_grade(cls, source: str | None) -> str | None:
        if source is None:
            return None
        try:
            tree = ast.parse(source, "<source>")
        except (SyntaxError, ValueError, RecursionError) as exc:
            line = getattr(exc, "lineno", None)
            where = f" (line {line})" if line else ""
            raise PydanticCustomError(
                "grader_source", "source is not valid Python{where}: {error}",
                {"where": where, "error": getattr(exc, "msg", str(exc))},
            ) from None  # fmt: skip
        if "grade" not in _top_level_names(tree):
            raise PydanticCustomError(
                "grader_source", "source defines no top-level `grade(sample, item)`"
            )
        return source

    @field_validator("file")
    @classmethod
    def _file_is_inside_the_code(cls, file: str | None) -> str | None:
        if file is None:
            return None
        path = PurePosixPath(file)
        if "\\" in file or path.is_absolute() or ".." in path.parts or path.suffix != ".py":
            raise PydanticCustomError(
                "grader_file",
                "a relative path to a .py file of the job's code directory "
                "(`path/to/file.py`, no `..`), not '{file}'",
                {"file": file},
            )
        return file

    @model_validator(mode="after")
    def _source_or_file(self) -> PythonGrader:
        if (self.source is None) == (self.file is None):
            raise PydanticCustomError(
                "spec_conflict", "a python grader needs exactly one of `source` and `file`"
            )
        return self


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: functions, classes, assignments and imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def refuse_model_graders(value: Any) -> Any:
    """`value` unchanged, unless it is a grader whose `type` needs a model (`MODEL_GRADERS`):
    raises `PydanticCustomError` (`grader_unavailable`) with the reason. Runs before a grader
    union's discriminator, so that such a grader is refused by name, not as an unknown tag."""
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(kind, str) and kind in MODEL_GRADERS:  # any JSON may come: {"type": {}} too
        raise PydanticCustomError("grader_unavailable", MODEL_GRADERS[kind])
    return value


def refuse_nested_multi(value: Any) -> Any:
    """`refuse_model_graders`, and a `multi` grader inside a multi grader is refused too."""
    if isinstance(value, dict) and value.get("type") == "multi":
        raise PydanticCustomError(
            "grader_nested_multi",
            "a multi grader's graders cannot be multi graders: write one formula instead",
        )
    return refuse_model_graders(value)


SubGrader = Annotated[
    StringCheckGrader | TextSimilarityGrader | PythonGrader,
    Field(discriminator="type"),
    BeforeValidator(refuse_nested_multi),
]

# The formula's vocabulary: these operators and functions, names and numbers, nothing else.
BINARY_OPERATORS: Final[dict[type[ast.operator], Callable[[float, float], float]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
UNARY_OPERATORS: Final[dict[type[ast.unaryop], Callable[[float], float]]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
FUNCTIONS: Final[dict[str, Callable[..., float]]] = {"min": min, "max": max, "abs": abs}
FUNCTION_ARITY: Final = {"min": (2, 64), "max": (2, 64), "abs": (1, 1)}


class FormulaError(ValueError):
    """A formula outside the whitelist; `column` is 1-based."""

    def __init__(self, column: int, message: str) -> None:
        super().__init__(f"column {column}: {message}")
        self.column = column
        self.message = message


def parse_formula(text: str, names: Collection[str]) -> ast.Expression:
    """`text` parsed as a Python expression (`ast.parse(mode="eval")`) that uses only `names`,
    numbers, `+ - * / **`, unary `-`/`+`, parentheses and `min(a, b, ...)`, `max(...)`,
    `abs(x)`; line breaks count as spaces. Raises `FormulaError` at the first thing outside
    that, with its column (1-based, in `text`)."""
    flat = text.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    body = flat.lstrip()
    lead = len(flat) - len(body)
    try:
        tree = ast.parse(body, "<calculate_output>", mode="eval")
    except SyntaxError as exc:
        raise FormulaError(lead + (exc.offset or 1), f"not an expression ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise FormulaError(lead + 1, f"not an expression ({exc})") from None
    _check(tree.body, body, lead, names)
    return tree


def _check(node: ast.expr, text: str, lead: int, names: Collection[str]) -> None:
    """Raises `FormulaError` at the first node under `node` outside the formula's vocabulary
    (`lead`: the columns left of `text` in the formula as written)."""
    column = lead + node.col_offset + 1
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise FormulaError(column, f"{node.value!r} is not allowed: only numbers")
    elif isinstance(node, ast.Name):
        if node.id not in names:
            close = difflib.get_close_matches(node.id, sorted(names), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"graders: {sorted(names)}"
            raise FormulaError(column, f"unknown grader {node.id!r}; {hint}")
    elif isinstance(node, ast.BinOp) and type(node.op) in BINARY_OPERATORS:
        _check(node.left, text, lead, names)
        _check(node.right, text, lead, names)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in UNARY_OPERATORS:
        _check(node.operand, text, lead, names)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in FUNCTIONS
        and not node.keywords
    ):
        low, high = FUNCTION_ARITY[node.func.id]
        if not low <= len(node.args) <= high:
            raise FormulaError(column, f"{node.func.id}() takes {low} to {high} arguments")
        for arg in node.args:
            _check(arg, text, lead, names)
    else:
        snippet = ast.get_source_segment(text, node) or type(node).__name__
        raise FormulaError(
            column,
            f"{snippet!r} is not allowed: only grader names, numbers, + - * / **, "
            "parentheses and min, max, abs",
        )


def evaluate_formula(tree: ast.Expression, scores: Mapping[str, float]) -> float:
    """The value of a formula from `parse_formula`, its names read from `scores`, computed in
    floats. Raises `ZeroDivisionError`; `OverflowError`; `ValueError` for a value that is not a
    finite real number (a negative number to a fractional power, inf, nan); `KeyError` for a
    name `scores` lacks."""
    value = _value(tree.body, scores)
    if not math.isfinite(value):
        raise ValueError(f"the formula's value is {value}")
    return value


def _value(node: ast.expr, scores: Mapping[str, float]) -> float:
    value: object
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        value = float(node.value)
    elif isinstance(node, ast.Name):
        value = float(scores[node.id])
    elif isinstance(node, ast.BinOp):
        left, right = _value(node.left, scores), _value(node.right, scores)
        value = BINARY_OPERATORS[type(node.op)](left, right)
    elif isinstance(node, ast.UnaryOp):
        value = UNARY_OPERATORS[type(node.op)](_value(node.operand, scores))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        value = FUNCTIONS[node.func.id](*(_value(a, scores) for a in node.args))
    else:  # parse_formula let no other node through
        raise ValueError(f"not a formula node: {ast.dump(node)}")
    if not isinstance(value, float):
        raise ValueError(f"{ast.unparse(node)!r} is not a real number: {value!r}")
    return value


class MultiGrader(_GraderBase):
    """Several graders combined by a formula over their scores (`calculate_output`)."""

    type: Literal["multi"] = Field(description="`multi`.")
    graders: dict[Annotated[str, Field(pattern=FORMULA_NAME)], SubGrader] = Field(
        min_length=1,
        max_length=16,
        description="The graders combined, by the names the formula uses (identifiers: a "
        "letter or '_', then letters, digits or '_'). Any grader but `multi`.",
        # pydantic states the names' pattern as `patternProperties`, which leaves any other
        # name valid in the JSON Schema; the model refuses it
        json_schema_extra={"additionalProperties": False},
    )
    calculate_output: str = Field(
        min_length=1,
        max_length=500,
        description="The score, a formula over the graders' names: numbers, `+ - * / **`, "
        "parentheses, `min`, `max`, `abs` (e.g. `0.5 * exact + 0.5 * sim`).",
    )

    @model_validator(mode="after")
    def _formula_and_names(self) -> MultiGrader:
        for key, grader in self.graders.items():
            if keyword.iskeyword(key) or key in FUNCTIONS:
                raise PydanticCustomError(
                    "grader_names",
                    "graders.{key}: '{key}' cannot name a grader of a formula (a Python "
                    "keyword or one of min, max, abs)",
                    {"key": key},
                )
            if "weight" in grader.model_fields_set:
                raise PydanticCustomError(
                    "spec_conflict",
                    "graders.{key}.weight: unused inside a multi grader; weigh it in "
                    "calculate_output",
                    {"key": key},
                )
        try:
            parse_formula(self.calculate_output, self.graders)
        except FormulaError as exc:
            raise PydanticCustomError(
                "grader_formula",
                "calculate_output: column {column}: {message}",
                {"column": exc.column, "message": exc.message},
            ) from None
        return self

    def formula(self) -> ast.Expression:
        """`calculate_output`, parsed (valid: checked at validation)."""
        return parse_formula(self.calculate_output, self.graders)


def check_grader_names(graders: list[AnyGrader]) -> list[AnyGrader]:
    """`graders` unchanged when no two share a `name`. Raises `PydanticCustomError`
    (`spec_conflict`) naming the index of the second one otherwise."""
    seen: set[str] = set()
    for index, grader in enumerate(graders):
        if grader.name in seen:
            raise PydanticCustomError(
                "spec_conflict",
                "graders[{index}].name: '{name}' names two graders; give each a distinct `name`",
                {"index": index, "name": grader.name},
            )
        seen.add(grader.name)
    return graders


AnyGrader = StringCheckGrader | TextSimilarityGrader | PythonGrader | MultiGrader
Grader = Annotated[AnyGrader, Field(discriminator="type"), BeforeValidator(refuse_model_graders)]
# What a spec's `graders` field is: one to 16 graders, each named once.
Graders = Annotated[
    list[Grader], Field(min_length=1, max_length=16), AfterValidator(check_grader_names)
]


def file_graders(graders: list[AnyGrader]) -> list[tuple[int, tuple[str, ...], str]]:
    """(index, path inside a `multi` grader: `()` or `('graders', key)`, the `file`) of each
    python grader that reads a `file`."""
    found: list[tuple[int, tuple[str, ...], str]] = []
    for index, grader in enumerate(graders):
        if isinstance(grader, PythonGrader) and grader.file is not None:
            found.append((index, (), grader.file))
        elif isinstance(grader, MultiGrader):
            found += [
                (index, ("graders", key), sub.file)
                for key, sub in grader.graders.items()
                if isinstance(sub, PythonGrader) and sub.file is not None
            ]
    return found
