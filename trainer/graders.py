"""The graders of reinforcement fine-tuning, built from their specs (`jobspec.graders`) and run on
sampled completions: `build_graders(specs, code_dir)` -> objects with `grade(sample, item) ->
float` and `close()`.

    graders = build_graders(spec.graders, code_dir)
    try:
        score = graders[0].grade({"output_text": text}, record)   # float
        graders[0].calls, graders[0].errors, graders[0].timeouts  # for metrics
    finally:
        for grader in graders:
            grader.close()

`sample` is the completion (`output_text`, more keys later), `item` the dataset record. Templates
(`input`, `reference`) are Jinja2 in its `SandboxedEnvironment` with `StrictUndefined`: a field
the record lacks raises `GraderError` naming the grader and the template, since a spec that does
not fit its data would otherwise score every sample 0 and train on nothing.

What a grader cannot score is 0.0 and counted, and training goes on: an exception in a `python`
grader's `grade()` or a return that is no finite number (`errors`, its message in `last_error`),
a call past `timeout_s` (`timeouts`), a `multi` formula that divides by zero or overflows
(`errors`).

A `python` grader runs the team's `grade()` in a child process of its own, for the grader's
whole life (`trainer/grader_child.py`, JSON lines over pipes). It is started with
`subprocess.Popen` rather than `multiprocessing`: a forked child would hold a copy of the
worker's memory and environment, a spawned one inherits `os.environ`, and neither can be given an
environment, a working directory and a session of its own to kill as one group. The child runs
`python -I` (no `PYTHON*` variables, no user site) with an environment of `PATH`, `LANG` and
`HOME` (a temporary directory) only, in the job's code directory, in a new session; on a timeout
the whole session is killed and a fresh child is started at the next call. This hides the
worker's environment from the team's code; it is no sandbox (same user, files and network).

Sources of the text-similarity metrics: `fuzzy_match`, rapidfuzz `fuzz.ratio` / 100 (normalized
Indel similarity); `bleu`, sacrebleu `sentence_bleu` / 100 (Papineni et al. 2002, with
sacrebleu's default exponential smoothing); `gleu`, NLTK `sentence_gleu` (Wu et al. 2016, tokens
split on whitespace); `rouge_N` / `rouge_l`, `rouge-score` F1 (Lin 2004), with its tokenizer
(lower-case, non-ASCII-alphanumerics dropped, no stemming).

Imports no torch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

from jinja2 import StrictUndefined, Template, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from dataformat.errors import InvalidJobError
from jobspec.graders import (
    AnyGrader,
    MultiGrader,
    PythonGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    evaluate_formula,
)

log = logging.getLogger(__name__)

CHILD: Final = Path(__file__).with_name("grader_child.py")
LOAD_TIMEOUT_S: Final = 60.0  # seconds a python grader's code may take to load (its imports)
_LOGGED_MESSAGES: Final = 32  # distinct error messages logged per grader; later ones only counted


class GraderError(InvalidJobError):
    """A grader cannot run on this job: a template that does not parse or names a field the
    record lacks, a python grader's file missing, or code that does not load."""


class BuiltGrader:
    """A grader ready to score: `grade(sample, item)` (a float; 0.0 when it cannot score, then
    counted) and `close()`. Counters for metrics: `calls`, `errors`, `timeouts`, and the last
    error's message, `last_error`."""

    def __init__(self, spec: AnyGrader) -> None:
        self.name = spec.name
        self.weight = spec.weight
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.last_error: str | None = None
        self._logged: set[str] = set()

    def grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        """The score of `sample` (the completion) for `item` (its dataset record). Raises
        `GraderError` when a template cannot be rendered for this record."""
        self.calls += 1
        return self._grade(sample, item)

    def _grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        raise NotImplementedError

    def counters(self) -> dict[str, int]:
        return {"calls": self.calls, "errors": self.errors, "timeouts": self.timeouts}

    def close(self) -> None:
        """Releases what the grader holds (a python grader's process); idempotent."""

    def _failed(self, message: str) -> float:
        """0.0, counted as an error; each distinct message is logged once (up to a cap)."""
        self.errors += 1
        self.last_error = message
        if message not in self._logged and len(self._logged) < _LOGGED_MESSAGES:
            self._logged.add(message)
            log.warning("grader %r scored a sample 0: %s", self.name, message)
        return 0.0

    def __enter__(self) -> BuiltGrader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_JINJA = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


class _Templates:
    """A grader's `input` and `reference` templates, compiled once."""

    def __init__(self, grader: str, input: str, reference: str) -> None:
        self.grader = grader
        self.sources = {"input": input, "reference": reference}
        self.compiled: dict[str, Template] = {}
        for field, text in self.sources.items():
            try:
                self.compiled[field] = _JINJA.from_string(text)
            except TemplateError as exc:
                raise GraderError(
                    f"grader {grader!r}: {field} {text!r} does not parse: {exc}"
                ) from exc

    def render(self, sample: dict[str, Any], item: dict[str, Any]) -> tuple[str, str]:
        """(input, reference) for this sample. Raises `GraderError` naming the template."""
        return self._render("input", sample, item), self._render("reference", sample, item)

    def _render(self, field: str, sample: dict[str, Any], item: dict[str, Any]) -> str:
        try:
            return self.compiled[field].render(sample=sample, item=item)
        except Exception as exc:  # undefined field, sandbox refusal, error in a filter
            raise GraderError(
                f"grader {self.grader!r}: {field} {self.sources[field]!r} cannot be rendered "
                f"for this record: {exc}"
            ) from exc


class StringCheck(BuiltGrader):
    """1.0 when `input` `operation` `reference` holds, else 0.0 (`like`: substring, `ilike`:
    substring after Unicode case folding)."""

    def __init__(self, spec: StringCheckGrader) -> None:
        super().__init__(spec)
        self.templates = _Templates(spec.name, spec.input, spec.reference)
        self.operation = spec.operation

    def _grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        text, reference = self.templates.render(sample, item)
        if self.operation == "eq":
            return float(text == reference)
        if self.operation == "ne":
            return float(text != reference)
        if self.operation == "like":
            return float(reference in text)
        return float(reference.casefold() in text.casefold())


def similarity(metric: str) -> Callable[[str, str], float]:
    """The function (text, reference) -> score in [0, 1] of a `text_similarity` metric (the
    module's docstring names each one's source)."""
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        return lambda text, reference: fuzz.ratio(text, reference) / 100.0
    if metric == "bleu":
        import sacrebleu

        return lambda text, reference: sacrebleu.sentence_bleu(text, [reference]).score / 100.0
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return lambda text, reference: float(sentence_gleu([reference.split()], text.split()))
    if metric.startswith("rouge_"):
        from rouge_score import rouge_scorer

        key = "rougeL" if metric == "rouge_l" else f"rouge{metric.removeprefix('rouge_')}"
        scorer = rouge_scorer.RougeScorer([key])
        return lambda text, reference: float(scorer.score(reference, text)[key].fmeasure)
    raise ValueError(f"unknown text_similarity metric {metric!r}")


class TextSimilarity(BuiltGrader):
    """`evaluation_metric` of `input` against `reference`, in [0, 1]; with `pass_threshold`,
    scores at or above it are also counted as `passed`."""

    def __init__(self, spec: TextSimilarityGrader) -> None:
        super().__init__(spec)
        self.templates = _Templates(spec.name, spec.input, spec.reference)
        self.metric = similarity(spec.evaluation_metric)
        self.pass_threshold = spec.pass_threshold
        self.passed = 0

    def _grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        score = self.metric(*self.templates.render(sample, item))
        if self.pass_threshold is not None and score >= self.pass_threshold:
            self.passed += 1
        return score

    def counters(self) -> dict[str, int]:
        if self.pass_threshold is None:
            return super().counters()
        return {**super().counters(), "passed": self.passed}


class PythonProcess(BuiltGrader):
    """The team's `grade(sample, item)` in a child process of its own (the module's docstring
    says how it is started and what it sees), `timeout_s` seconds per call.

    Raises `GraderError` at construction when the `file` is missing or the code does not load
    (an exception, no `grade(sample, item)`, or more than `LOAD_TIMEOUT_S` seconds), and from
    `grade` when a restarted process does not load. A restart (after a timeout or an exit)
    happens at the next call, whose `timeout_s` starts once the code is loaded. Not thread-safe:
    one caller at a time."""

    def __init__(self, spec: PythonGrader, code_dir: Path | None) -> None:
        super().__init__(spec)
        self.timeout_s = spec.timeout_s
        if spec.file is not None:
            if code_dir is None or not (code_dir / spec.file).is_file():
                raise GraderError(f"grader {spec.name!r}: no file {spec.file!r} in the job's code")
            self.code = {"file": str((code_dir / spec.file).resolve())}
        else:
            assert spec.source is not None  # the spec holds one of the two
            self.code = {"source": spec.source}
        self.home = Path(tempfile.mkdtemp(prefix="grader-home-"))
        self.cwd = code_dir if code_dir is not None else self.home
        self.process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._start()

    def _start(self) -> None:
        environment = {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(self.home),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
            cwd=self.cwd,
            start_new_session=True,
        )
        self._buffer = b""
        answer = self._exchange(self.code, time.monotonic() + LOAD_TIMEOUT_S)
        if answer is None or "ready" not in answer:
            self._stop()
            why = f"took over {LOAD_TIMEOUT_S:g} s" if answer is None else answer.get("error")
            raise GraderError(f"python grader {self.name!r} did not load: {why}")

    def _grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        if self.process is None:
            self._start()
        request = {"sample": sample, "item": item}
        answer = self._exchange(request, time.monotonic() + self.timeout_s)
        if answer is None:
            self._stop()
            self.timeouts += 1
            return 0.0
        if "error" in answer:
            return self._failed(str(answer["error"]))
        return float(answer["score"])

    def _exchange(self, message: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        """Sends `message`, returns the answer, or None past `deadline` (`time.monotonic()`).
        A child that exits, or answers no JSON object, is stopped and answers an error."""
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            self.process.stdin.flush()
            line = self._read_line(deadline)
            if line is None:
                return None
            answer = json.loads(line)
            if not isinstance(answer, dict):
                raise ValueError(f"not a JSON object: {line[:200]!r}")
            return answer
        except (BrokenPipeError, EOFError, ValueError) as exc:
            code = self._stop()
            return {"error": f"the grader's process failed (exit code {code}): {exc}"}

    def _read_line(self, deadline: float) -> bytes | None:
        """The child's next line (without its newline), or None past `deadline`. Raises
        `EOFError` when the child closed its output."""
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("the grader's process closed its output")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _stop(self) -> int | None:
        """Kills the child's whole session (it and anything it started); its exit code."""
        process, self.process = self.process, None
        if process is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        for stream in (process.stdin, process.stdout):
            _close_quietly(stream)
        return code

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self.home, ignore_errors=True)


def _close_quietly(stream: IO[bytes] | None) -> None:
    try:
        if stream is not None:
            stream.close()
    except BrokenPipeError:  # a killed child leaves unflushed bytes behind: nothing to deliver
        pass


class Multi(BuiltGrader):
    """`calculate_output` over the scores of its graders (`graders`, by formula name), computed
    by `jobspec.graders.evaluate_formula`; an arithmetic failure scores 0.0, counted."""

    def __init__(self, spec: MultiGrader, code_dir: Path | None) -> None:
        super().__init__(spec)
        self.formula = spec.formula()
        self.graders: dict[str, BuiltGrader] = {}
        try:
            for key, sub in spec.graders.items():
                self.graders[key] = build_grader(sub, code_dir)
        except BaseException:
            self.close()
            raise

    def _grade(self, sample: dict[str, Any], item: dict[str, Any]) -> float:
        scores = {key: grader.grade(sample, item) for key, grader in self.graders.items()}
        try:
            return evaluate_formula(self.formula, scores)
        except (ArithmeticError, ValueError) as exc:
            return self._failed(f"calculate_output: {exc}")

    def close(self) -> None:
        for grader in self.graders.values():
            grader.close()


def build_grader(spec: AnyGrader, code_dir: Path | None) -> BuiltGrader:
    """The grader of `spec`; `code_dir`: the job's code directory (a python grader's `file` is
    relative to it, and its process runs there). Raises `GraderError` (as each class says)."""
    if isinstance(spec, StringCheckGrader):
        return StringCheck(spec)
    if isinstance(spec, TextSimilarityGrader):
        return TextSimilarity(spec)
    if isinstance(spec, PythonGrader):
        return PythonProcess(spec, code_dir)
    return Multi(spec, code_dir)


def build_graders(specs: Iterable[AnyGrader], code_dir: Path | None) -> list[BuiltGrader]:
    """The graders of `specs`, in order; those already built are closed when one fails. Raises
    `GraderError` (`build_grader`)."""
    built: list[BuiltGrader] = []
    try:
        for spec in specs:
            built.append(build_grader(spec, code_dir))
    except BaseException:
        for grader in built:
            grader.close()
        raise
    return built
