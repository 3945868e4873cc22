"""The graders of reinforcement fine-tuning at run time (`trainer.graders`): each built-in grader
scores real strings as its library does, a python grader runs the team's `grade()` in a child
process that sees none of the worker's environment and is restarted after a timeout, and what
cannot be scored is 0.0 and counted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from jobspec.graders import AnyGrader, Graders
from trainer.graders import (
    BuiltGrader,
    GraderError,
    Multi,
    PythonProcess,
    build_grader,
    build_graders,
)

ROOT = Path(__file__).resolve().parents[3]
GRADERS: TypeAdapter[Any] = TypeAdapter(Graders)
OUTPUT = "{{ sample.output_text }}"
ANSWER = "{{ item.answer }}"
SLACK_S = 3.0  # a loaded 2-core host: process start, kill and reap on top of the timeout


def spec(**raw: Any) -> AnyGrader:
    parsed: AnyGrader = GRADERS.validate_python([{"name": "g", **raw}])[0]
    return parsed


@pytest.fixture
def built() -> Iterator[list[BuiltGrader]]:
    """Graders a test builds, closed after it whatever happens."""
    graders: list[BuiltGrader] = []
    yield graders
    for grader in graders:
        grader.close()


def python(built: list[BuiltGrader], source: str, code_dir: Path | None = None, **raw: Any) -> Any:
    grader = build_grader(spec(type="python", source=textwrap.dedent(source), **raw), code_dir)
    built.append(grader)
    return grader


def sample(text: str) -> dict[str, Any]:
    return {"output_text": text}


@pytest.mark.parametrize(
    ("operation", "output", "answer", "score"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "Paris", "paris", 0.0),
        ("ne", "Paris", "Lyon", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "The capital is Paris.", "Paris", 1.0),
        ("like", "The capital is Paris.", "paris", 0.0),
        ("ilike", "THE CAPITAL IS PARIS.", "paris", 1.0),
        ("ilike", "Die Straße", "STRASSE", 1.0),  # Unicode case folding: ß folds to ss
        ("ilike", "The capital is Lyon.", "paris", 0.0),
    ],
)
def test_string_check_compares_rendered_input_and_reference(
    operation: str, output: str, answer: str, score: float
) -> None:
    grader = build_grader(
        spec(type="string_check", input=OUTPUT, reference=ANSWER, operation=operation), None
    )
    assert grader.grade(sample(output), {"answer": answer}) == score
    assert grader.counters() == {"calls": 1, "errors": 0, "timeouts": 0}


HYPOTHESIS = "yesterday the cat sat on the red mat by the door"
REFERENCE = "the cat was sitting on the red mat by the door"  # shares n-grams up to n = 6


def library_score(metric: str, text: str, reference: str) -> float:
    """What each library computes itself for (text, reference)."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return fuzz.ratio(text, reference) / 100
    if metric == "bleu":
        import sacrebleu

        return sacrebleu.sentence_bleu(text, [reference]).score / 100
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return float(sentence_gleu([reference.split()], text.split()))
    from rouge_score import rouge_scorer

    key = "rougeL" if metric == "rouge_l" else "rouge" + metric[-1]
    return rouge_scorer.RougeScorer([key]).score(reference, text)[key].fmeasure


@pytest.mark.parametrize(
    "metric", ["fuzzy_match", "bleu", "gleu", "rouge_1", "rouge_2", "rouge_3", "rouge_4",
               "rouge_5", "rouge_l"],
)  # fmt: skip
def test_text_similarity_is_what_its_library_computes(metric: str) -> None:
    grader = build_grader(
        spec(type="text_similarity", input=OUTPUT, reference=ANSWER, evaluation_metric=metric),
        None,
    )
    score = grader.grade(sample(HYPOTHESIS), {"answer": REFERENCE})
    assert 0.0 < score < 1.0
    assert score == pytest.approx(library_score(metric, HYPOTHESIS, REFERENCE))
    same = grader.grade(sample(REFERENCE), {"answer": REFERENCE})
    assert same == pytest.approx(1.0)


def test_bleu_scores_the_sample_as_the_hypothesis() -> None:
    grader = build_grader(
        spec(type="text_similarity", input=OUTPUT, reference=ANSWER, evaluation_metric="bleu"),
        None,
    )
    short = "the red mat"  # its n-grams all in REFERENCE: BLEU 0.07 this way round, 0.14 swapped
    score = grader.grade(sample(short), {"answer": REFERENCE})
    assert score == pytest.approx(library_score("bleu", short, REFERENCE))
    assert score < library_score("bleu", REFERENCE, short) - 0.05


def test_text_similarity_counts_scores_at_the_pass_threshold() -> None:
    grader = build_grader(
        spec(
            type="text_similarity",
            input=OUTPUT,
            reference=ANSWER,
            evaluation_metric="fuzzy_match",
            pass_threshold=0.9,
        ),
        None,
    )
    assert grader.grade(sample("abcdefghij"), {"answer": "abcdefghij"}) == 1.0
    assert grader.grade(sample("abcdefghXY"), {"answer": "abcdefghij"}) == 0.8
    assert grader.counters() == {"calls": 2, "errors": 0, "timeouts": 0, "passed": 1}


def test_a_field_the_record_lacks_is_an_error_naming_the_template() -> None:
    grader = build_grader(
        spec(type="string_check", name="exact", input=OUTPUT, reference=ANSWER, operation="eq"),
        None,
    )
    with pytest.raises(GraderError) as raised:
        grader.grade(sample("4"), {"question": "2 + 2?"})
    message = str(raised.value)
    assert "grader 'exact'" in message and "reference '{{ item.answer }}'" in message
    assert "'dict object' has no attribute 'answer'" in message


def test_a_template_that_does_not_parse_fails_the_build() -> None:
    raw = spec(type="string_check", input="{{ sample.output_text", reference=ANSWER, operation="eq")
    with pytest.raises(GraderError, match=r"input '\{\{ sample.output_text' does not parse"):
        build_grader(raw, None)


def test_templates_render_in_a_sandbox() -> None:
    unsafe = "{{ item.__class__.__mro__ }}"
    grader = build_grader(
        spec(type="string_check", input=unsafe, reference=ANSWER, operation="eq"), None
    )
    with pytest.raises(GraderError, match="cannot be rendered"):
        grader.grade(sample("x"), {"answer": "x"})


def test_a_python_grader_scores_with_the_teams_function(built: list[BuiltGrader]) -> None:
    grader = python(
        built,
        """
        def grade(sample, item):
            print("printed by the team's code")  # must not break the protocol
            return float(sample["output_text"].strip() == item["answer"])
        """,
    )
    assert grader.grade(sample(" 42 "), {"answer": "42"}) == 1.0
    assert grader.grade(sample("41"), {"answer": "42"}) == 0.0
    assert grader.counters() == {"calls": 2, "errors": 0, "timeouts": 0}


def test_a_python_grader_past_its_timeout_scores_0_then_works_again(
    built: list[BuiltGrader],
) -> None:
    grader = python(
        built,
        """
        def grade(sample, item):
            while item.get("hang"):
                pass
            return 1.0
        """,
        timeout_s=0.5,
    )
    started = time.monotonic()
    assert grader.grade(sample("x"), {"hang": True}) == 0.0
    took = time.monotonic() - started
    assert 0.5 <= took < 0.5 + SLACK_S
    assert (grader.timeouts, grader.errors) == (1, 0)
    assert grader.grade(sample("x"), {}) == 1.0
    assert grader.counters() == {"calls": 2, "errors": 0, "timeouts": 1}


def test_an_exception_in_grade_scores_0_counted_with_its_message(
    built: list[BuiltGrader],
) -> None:
    grader = python(
        built,
        """
        def grade(sample, item):
            raise ValueError("no number in " + sample["output_text"])
        """,
    )
    assert grader.grade(sample("abc"), {}) == 0.0
    assert grader.errors == 1
    assert grader.last_error == "ValueError: no number in abc (line 3 of <source>)"


@pytest.mark.parametrize(
    ("returned", "says"),
    [
        ("'1.0'", "returned str, not a number"),
        ("None", "returned NoneType, not a number"),
        ("True", "returned bool, not a number"),
        ("float('nan')", "returned nan, not a finite number"),
    ],
)
def test_a_return_that_is_no_finite_number_scores_0_counted(
    built: list[BuiltGrader], returned: str, says: str
) -> None:
    grader = python(built, f"def grade(sample, item):\n    return {returned}\n")
    assert grader.grade(sample("x"), {}) == 0.0
    assert grader.errors == 1 and grader.last_error is not None and says in grader.last_error


def test_a_grader_process_that_exits_scores_0_and_is_restarted(built: list[BuiltGrader]) -> None:
    grader = python(
        built,
        """
        import os
        def grade(sample, item):
            if item.get("exit"):
                os._exit(3)
            return 1.0
        """,
    )
    assert grader.grade(sample("x"), {"exit": True}) == 0.0
    assert grader.errors == 1 and "exit code 3" in (grader.last_error or "")
    assert grader.grade(sample("x"), {}) == 1.0


def test_the_teams_code_sees_none_of_the_workers_environment(
    built: list[BuiltGrader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHYARD_GRADER_MARKER", "secret")
    # One bit per fact, so that a failure says which: the marker absent, PATH present, a HOME
    # of its own that exists, nothing beyond PATH, LANG, HOME (LC_CTYPE: Python's C-locale
    # coercion, PEP 538).
    grader = python(
        built,
        """
        import os
        def grade(sample, item):
            home = os.environ.get("HOME", "")
            return float(
                ("TORCHYARD_GRADER_MARKER" not in os.environ)
                + 2 * ("PATH" in os.environ)
                + 4 * (home != item["worker_home"] and os.path.isdir(home))
                + 8 * (set(os.environ) <= {"PATH", "LANG", "HOME", "LC_CTYPE"})
            )
        """,
    )
    assert os.environ["TORCHYARD_GRADER_MARKER"] == "secret"
    assert grader.grade(sample("x"), {"worker_home": os.environ.get("HOME", "")}) == 15.0


def test_a_file_grader_runs_in_the_code_directory_and_imports_its_neighbours(
    tmp_path: Path, built: list[BuiltGrader]
) -> None:
    (tmp_path / "graders").mkdir()
    (tmp_path / "answers.py").write_text("EXPECTED = 'forty-two'\n")
    (tmp_path / "graders" / "check.py").write_text(
        textwrap.dedent(
            """
            import os
            from answers import EXPECTED
            def grade(sample, item):
                return float(sample["output_text"] == EXPECTED and os.getcwd() == item["cwd"])
            """
        )
    )
    grader = build_grader(spec(type="python", file="graders/check.py"), tmp_path)
    built.append(grader)
    cwd = str(tmp_path.resolve())
    assert grader.grade(sample("forty-two"), {"cwd": cwd}) == 1.0
    assert grader.grade(sample("forty-one"), {"cwd": cwd}) == 0.0


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({}, "no file 'check.py' in the job's code"),
        ({"check.py": "import no_such_module\n"}, "ModuleNotFoundError"),
        ({"check.py": "def grade(sample):\n    return 1.0\n"}, "cannot be called as grade"),
        ({"check.py": "GRADE = 1\n"}, "defines no function `grade"),
    ],
)
def test_a_file_grader_that_cannot_load_fails_the_build(
    tmp_path: Path, files: dict[str, str], says: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(GraderError, match=r"did not load|no file") as raised:
        build_grader(spec(type="python", file="check.py"), tmp_path)
    assert says in str(raised.value)


def test_close_kills_the_process_and_removes_its_home(built: list[BuiltGrader]) -> None:
    grader: PythonProcess = python(built, "def grade(sample, item):\n    return 1.0\n")
    process, home = grader.process, grader.home
    assert process is not None and process.poll() is None and home.is_dir()
    grader.close()
    assert process.poll() is not None and not home.exists()
    grader.close()  # idempotent


def test_a_failed_build_closes_the_graders_built_before_it(tmp_path: Path) -> None:
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    specs = [
        spec(type="python", name="first", source="def grade(sample, item):\n    return 1.0\n"),
        spec(type="python", name="second", file="missing.py"),
    ]
    with pytest.raises(GraderError, match=r"no file 'missing\.py'"):
        build_graders(specs, tmp_path)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before


def test_multi_combines_its_graders_scores_by_its_formula(built: list[BuiltGrader]) -> None:
    raw = {
        "type": "multi",
        "graders": {
            "exact": {"type": "string_check", "name": "exact", "input": OUTPUT,
                      "reference": ANSWER, "operation": "eq"},
            "sim": {"type": "text_similarity", "name": "sim", "input": OUTPUT,
                    "reference": ANSWER, "evaluation_metric": "fuzzy_match"},
        },
        "calculate_output": "0.5 * exact + 0.5 * sim",
    }  # fmt: skip
    (grader,) = build_graders([spec(**raw)], None)
    built.append(grader)
    assert isinstance(grader, Multi)
    from rapidfuzz import fuzz

    fuzzy = fuzz.ratio("abcd", "abce") / 100
    assert grader.grade(sample("abcd"), {"answer": "abce"}) == pytest.approx(0.5 * fuzzy)
    assert grader.grade(sample("abcd"), {"answer": "abcd"}) == pytest.approx(1.0)
    assert grader.graders["exact"].calls == 2


def test_multi_scores_0_counted_when_its_formula_divides_by_zero() -> None:
    raw = {
        "type": "multi",
        "graders": {"exact": {"type": "string_check", "name": "exact", "input": OUTPUT,
                              "reference": ANSWER, "operation": "eq"}},
        "calculate_output": "1 / exact",
    }  # fmt: skip
    grader = build_grader(spec(**raw), None)
    assert grader.grade(sample("a"), {"answer": "a"}) == 1.0
    assert grader.grade(sample("a"), {"answer": "b"}) == 0.0
    assert grader.errors == 1 and grader.last_error == "calculate_output: float division by zero"


def test_the_graders_module_imports_no_torch() -> None:
    code = "import sys, trainer.graders; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
