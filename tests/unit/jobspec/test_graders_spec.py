"""Validation of reinforcement fine-tuning graders (`jobspec.graders`): OpenAI's shapes parse, and
each refusal (a metric or grader that cannot run, a formula outside the whitelist, two graders of
one name) comes at the JSON path of the field to change, with a message that says why."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from jobspec.graders import (
    FormulaError,
    Graders,
    MultiGrader,
    PythonGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    evaluate_formula,
    parse_formula,
)

GRADERS: TypeAdapter[Any] = TypeAdapter(Graders)
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}
SIM = {
    "type": "text_similarity",
    "name": "sim",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "evaluation_metric": "rouge_l",
}
PYTHON = {"type": "python", "name": "py", "source": "def grade(sample, item):\n    return 1.0\n"}


def multi(formula: str, **graders: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "multi",
        "name": "combined",
        "graders": graders or {"exact": EXACT, "sim": SIM},
        "calculate_output": formula,
    }


def errors(raw: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """{location: error} of the `ValidationError` that `raw` must raise."""
    with pytest.raises(ValidationError) as exc:
        GRADERS.validate_python(raw)
    return {tuple(e["loc"]): e for e in exc.value.errors()}


def test_openai_shaped_graders_parse_with_their_defaults() -> None:
    raw = [EXACT, {**SIM, "pass_threshold": 0.5}, PYTHON, multi("0.5 * exact + 0.5 * sim")]
    exact, sim, python, combined = GRADERS.validate_python(raw)
    assert isinstance(exact, StringCheckGrader) and exact.operation == "eq"
    assert isinstance(sim, TextSimilarityGrader) and sim.pass_threshold == 0.5
    assert isinstance(python, PythonGrader) and python.timeout_s == 5.0 and python.file is None
    assert isinstance(combined, MultiGrader)
    assert isinstance(combined.graders["sim"], TextSimilarityGrader)
    assert [g.weight for g in (exact, sim, python, combined)] == [1.0] * 4
    file_form = GRADERS.validate_python([{**PYTHON, "source": None, "file": "graders/math.py"}])
    assert file_form[0].file == "graders/math.py"


def test_an_unknown_operation_is_refused_at_operation() -> None:
    found = errors([{**EXACT, "operation": "contains"}])
    assert found[(0, "string_check", "operation")]["type"] == "literal_error"


@pytest.mark.parametrize(("metric", "why"), [("meteor", "WordNet"), ("cosine", "embedding model")])
def test_metrics_that_cannot_run_on_a_worker_are_refused_saying_why(metric: str, why: str) -> None:
    found = errors([{**SIM, "evaluation_metric": metric}])
    error = found[(0, "text_similarity", "evaluation_metric")]
    assert error["type"] == "grader_metric_unavailable"
    assert why in error["msg"]
    schema = str(GRADERS.json_schema())
    assert "rouge_l" in schema and f"'{metric}'" not in schema


@pytest.mark.parametrize("kind", ["score_model", "label_model"])
def test_model_graders_are_refused_as_unavailable(kind: str) -> None:
    raw = {"type": kind, "name": "judge", "input": [], "model": "gpt-4o"}
    error = errors([EXACT, raw])[(1,)]
    assert error["type"] == "grader_unavailable"
    assert error["msg"] == f"{kind} graders need a registered grader model; none is available"


def test_two_graders_of_one_name_are_refused_naming_the_second() -> None:
    error = errors([EXACT, {**SIM, "name": "exact"}])[()]
    assert error["type"] == "spec_conflict"
    assert error["msg"].startswith("graders[1].name: 'exact' names two graders")


@pytest.mark.parametrize(
    ("formula", "column", "says"),
    [
        ("exact + * sim", 9, "not an expression"),
        ("exact + __import__('os')", 9, "__import__('os')\" is not allowed"),
        ("exact + simm", 9, "unknown grader 'simm'; did you mean 'sim'?"),
        ("  exact.real", 3, "'exact.real' is not allowed"),
        ("exact if sim else 0", 1, "is not allowed"),
        ("max(exact, sim) + 'a'", 19, "'a' is not allowed: only numbers"),
        ("min(exact)", 1, "min() takes 2 to 64 arguments"),
        ("abs(x=exact)", 1, "is not allowed"),
        ("exact % 2", 1, "is not allowed"),
        ("(exact,\n sim)", 1, "is not allowed"),
    ],
)
def test_a_formula_outside_the_whitelist_is_refused_with_its_column(
    formula: str, column: int, says: str
) -> None:
    error = errors([multi(formula)])[(0, "multi")]
    assert error["type"] == "grader_formula"
    assert error["msg"].startswith(f"calculate_output: column {column}: ")
    assert says in error["msg"]


def test_a_formula_computes_with_the_whitelisted_operators_in_floats() -> None:
    names = {"a", "b"}
    scores = {"a": 0.25, "b": 0.5}
    cases = {
        "0.5 * a + 0.5 * b": 0.375,
        "-a + +b": 0.25,
        "(a + b) / 2": 0.375,
        "b ** 2": 0.25,
        "min(a, b, 0.1) + max(a, b) + abs(a - b)": 0.1 + 0.5 + 0.25,
        "a\n + b": 0.75,
    }
    for formula, value in cases.items():
        assert evaluate_formula(parse_formula(formula, names), scores) == pytest.approx(value)


def test_a_formula_fails_on_values_that_are_no_finite_real_number() -> None:
    names = {"a", "b"}
    with pytest.raises(ZeroDivisionError):
        evaluate_formula(parse_formula("a / b", names), {"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match="not a real number"):
        evaluate_formula(parse_formula("(a - 1) ** 0.5", names), {"a": 0.0, "b": 0.0})
    with pytest.raises(ValueError, match="inf"):
        evaluate_formula(parse_formula("a * 1e308 * 10", names), {"a": 1.0, "b": 0.0})
    started = time.monotonic()
    with pytest.raises(OverflowError):  # in floats: no huge integer is built
        evaluate_formula(parse_formula("9 ** 9 ** 9 * a", names), {"a": 1.0, "b": 0.0})
    assert time.monotonic() - started < 1.0
    with pytest.raises(FormulaError):
        parse_formula("min + a", names)


def test_a_multi_grader_refuses_a_nested_multi_a_weight_and_a_keyword_name() -> None:
    nested = errors([multi("inner", inner=multi("exact", exact=EXACT))])
    assert "cannot be multi graders" in nested[(0, "multi", "graders", "inner")]["msg"]
    weighted = errors([multi("exact", exact={**EXACT, "weight": 2.0})])
    assert "graders.exact.weight: unused inside a multi grader" in weighted[(0, "multi")]["msg"]
    keyword = errors([multi("1", max=EXACT)])
    assert "'max' cannot name a grader of a formula" in keyword[(0, "multi")]["msg"]
    bad_key = errors([multi("1", **{"exact-1": EXACT})])
    assert (0, "multi", "graders", "exact-1", "[key]") in bad_key


@pytest.mark.parametrize(
    ("python", "location", "says"),
    [
        ({"file": "graders/x.py"}, (0, "python"), "exactly one of `source` and `file`"),
        ({"source": None}, (0, "python"), "exactly one of `source` and `file`"),
        ({"source": "def grade(sample, item)\n"}, (0, "python", "source"), "(line 1)"),
        ({"source": "def score(s, i):\n    return 1\n"}, (0, "python", "source"), "no top-level"),
        ({"source": None, "file": "../x.py"}, (0, "python", "file"), "no `..`"),
        ({"source": None, "file": "/abs/x.py"}, (0, "python", "file"), "relative path"),
        ({"source": None, "file": "grade.txt"}, (0, "python", "file"), ".py file"),
        ({"timeout_s": 61}, (0, "python", "timeout_s"), "less than or equal to 60"),
        ({"timeout_s": 0}, (0, "python", "timeout_s"), "greater than 0"),
    ],
)
def test_a_python_grader_is_refused_at_the_field_to_change(
    python: dict[str, Any], location: tuple[Any, ...], says: str
) -> None:
    assert says in errors([{**PYTHON, **python}])[location]["msg"]


def test_a_source_may_bind_grade_by_import_or_assignment() -> None:
    for source in ("from helpers import grade\n", "grade = lambda sample, item: 1.0\n"):
        assert GRADERS.validate_python([{**PYTHON, "source": source}])[0].source == source


def test_weights_and_thresholds_are_numbers_in_range() -> None:
    assert (0, "string_check", "weight") in errors([{**EXACT, "weight": True}])
    assert (0, "string_check", "weight") in errors([{**EXACT, "weight": "inf"}])
    assert (0, "text_similarity", "pass_threshold") in errors([{**SIM, "pass_threshold": 1.5}])
    assert GRADERS.validate_python([{**EXACT, "weight": -0.5}])[0].weight == -0.5


@pytest.mark.parametrize("kind", [{}, [], 3, None])
def test_a_grader_type_that_is_no_string_is_a_validation_error(kind: object) -> None:
    """The schema fuzz sent `{"type": {}}`: the model-grader refusal looked it up in a dict."""
    with pytest.raises(ValidationError):
        GRADERS.validate_python([{"type": kind, "name": "a"}])
    multi = {"type": "multi", "name": "m", "calculate_output": "a"}
    with pytest.raises(ValidationError):
        MultiGrader.model_validate({**multi, "graders": {"a": {"type": kind}}})
