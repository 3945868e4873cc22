"""What an eval job (`evaluate` in its spec) amounted to: its scores, what it scored, and the
baseline beside them, for the end-of-run summary and `torchyard show`.

`eval_result` is pure (models in, dataclass out). Its input is the evals API's answer for the
source job (`GET /v1/jobs/{source}/evals`): the evaluations of every eval job on that job's
weights, this one's among them. The baseline of an evaluation is the one of the same name that
another eval job ran on the source's starting weights (`evaluate.source.initial`, as
`eval_after.baseline` queues): nothing is compared when there is none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text

from torchyard.client import Client
from torchyard.errors import NotFound
from torchyard.types import Evaluation, Job
from torchyard.units import format_value


@dataclass(frozen=True)
class EvalResult:
    """An eval job's scores, keyed ``<evaluation>.<metric>`` as its metric series are, and the
    weights they are of: a checkpoint (`checkpoint_id`, at `step`) of job `source_job`, or
    its starting weights (`initial`). `baseline`: the starting weights' score of the same name,
    where another eval job (`baseline_job`) measured it."""

    source_job: int
    checkpoint_id: int | None
    step: int | None
    initial: bool
    scores: dict[str, float] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    baseline_job: int | None = None

    @property
    def source_text(self) -> str:
        """``job 12, checkpoint 34 (step 600)`` or ``job 12, starting weights``."""
        if self.initial:
            return f"job {self.source_job}, starting weights"
        checkpoint = "-" if self.checkpoint_id is None else str(self.checkpoint_id)
        step = "" if self.step is None else f" (step {self.step})"
        return f"job {self.source_job}, checkpoint {checkpoint}{step}"


def _scores(evaluation: Evaluation) -> dict[str, float]:
    return {f"{evaluation.name}.{k}": v for k, v in evaluation.metrics.items()}


def eval_result(job: Job, evaluations: Iterable[Evaluation]) -> EvalResult | None:
    """`job`'s result from `evaluations` (any of the source job's, see the module); None for a
    job that is no eval job."""
    source = job.eval_source
    if source is None:
        return None
    found = list(evaluations)
    own = [e for e in found if e.job_id == job.id]
    bases = sorted(
        (
            e
            for e in found
            if e.job_id != job.id and e.source_job_id == source.job and e.checkpoint_id is None
        ),
        key=lambda e: e.job_id,
    )
    scores = {k: v for e in own for k, v in _scores(e).items()}
    baseline = {} if source.initial else {k: v for e in bases for k, v in _scores(e).items()}
    baseline = {k: v for k, v in baseline.items() if k in scores}
    return EvalResult(
        source_job=source.job,
        checkpoint_id=source.checkpoint,
        step=own[0].step if own else job.current_step,
        initial=source.initial,
        scores=scores,
        baseline=baseline,
        baseline_job=bases[-1].job_id if baseline else None,
    )


def score_rows(result: EvalResult) -> list[tuple[str | Text, Text | str]]:
    """One row per score (``perplexity.loss  2.768  base 3.412, change -0.644``), then the
    weights scored (``source``) and the baseline's eval job."""
    rows: list[tuple[str | Text, Text | str]] = []
    for name, value in sorted(result.scores.items()):
        text = Text(format_value(value))
        if (base := result.baseline.get(name)) is not None:
            delta = value - base  # as the page's change column: `+` then `fmtNumber`
            change = ("+" if delta > 0 else "") + format_value(delta)
            text.append(f"  base {format_value(base)}, change {change}", style="dim")
        rows.append((Text(name), text))
    if not result.scores:
        rows.append(("scores", "-"))
    rows.append(("source", Text(result.source_text)))
    if result.baseline_job is not None:
        rows.append(("baseline", Text(f"eval job {result.baseline_job} (starting weights)")))
    return rows


def score_table(result: EvalResult) -> Table:
    """`score_rows` as a two-column grid, as `torchyard show` prints it above the job's rows."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in score_rows(result):
        table.add_row(key, value)
    return table


def fetch_evaluations(client: Client, job: Job) -> list[Evaluation]:
    """The evaluations `eval_result` reads for eval job `job`: its source's (the baseline's
    among them), or its own alone once the source job is gone. Empty for another kind."""
    source = job.eval_source
    if source is None:
        return []
    try:
        return client.jobs.evals(source.job)
    except NotFound:
        return client.jobs.evals(job.id)
