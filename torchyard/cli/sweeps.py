"""The `torchyard sweep` commands of `torchyard.sweeps` (typer, rich): the SDK part stays
there, importing neither."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import typer
from rich.text import Text

from torchyard.cli.common import JsonOpt, command_client, err, out, print_json
from torchyard.specs import apply_overrides, load_spec
from torchyard.sweeps import Sweeps
from torchyard.tables import Column, ListTable
from torchyard.types import Sweep, Trial
from torchyard.units import format_age, format_value

sweep_app = typer.Typer(no_args_is_help=True, help="Hyperparameter sweeps: trials as jobs.")
SweepArg = Annotated[int, typer.Argument(help="Sweep id.", metavar="SWEEP")]


def _sweeps(ctx: typer.Context) -> Sweeps:
    return command_client(ctx).sweeps


def _sweeps_table(sweeps: Iterable[Sweep]) -> ListTable:
    """One row per sweep: id, name, state, trials by state, best trial and its value, age; the
    age goes first on a narrow terminal."""
    table = ListTable(
        Column("ID", "num"),
        Column("NAME", "name"),
        Column("STATE", "id"),
        Column("TRIALS", "text", drop=3),
        Column("BEST", "id", drop=2),
        Column("VALUE", "num"),
        Column("CREATED", "id", drop=1),
    )
    for sweep in sweeps:
        ended = sum(n for state, n in sweep.trials.items() if state != "running")
        best = sweep.best
        table.add_row(
            str(sweep.id),
            Text(sweep.name),
            sweep.state,
            f"{ended}/{sweep.max_trials} ended, {sweep.trials.get('running', 0)} running",
            f"trial {best.number}" if best else "-",
            format_value(best.value if best else None),
            format_age(sweep.created_at) if sweep.created_at else "-",
        )
    return table


def _trials_table(trials: list[Trial]) -> ListTable:
    """One row per trial: its values, state, metric, job and where it was pruned or why it
    failed (whole, under the row when it does not fit); the step goes first when narrow."""
    paths = sorted({p for t in trials for p in t.params})
    table = ListTable(
        Column("TRIAL", "num"),
        Column("STATE", "id"),
        *(Column(path, "num") for path in paths),
        Column("VALUE", "num"),
        Column("JOB", "num"),
        Column("STEP", "num", drop=1),
        Column("NOTE", "long"),
    )
    for t in trials:
        note = ""
        if t.state == "pruned":
            note = f"pruned at step {t.pruned_step}" + (
                f" (rung {t.pruned_rung})" if t.pruned_rung is not None else ""
            )
        elif t.error:
            note = t.error
        table.add_row(
            str(t.number),
            t.state,
            *(_param(t.params.get(p)) for p in paths),
            format_value(t.value),
            str(t.job_id) if t.job_id is not None else "-",
            str(t.current_step) if t.current_step is not None else "-",
            Text(note),
        )
    return table


def _param(value: object) -> str:
    if isinstance(value, float):
        return format_value(value)
    return "-" if value is None else str(value)


@sweep_app.command("submit")
def sweep_submit(
    ctx: typer.Context,
    spec_path: Annotated[str, typer.Argument(metavar="SPEC", help="YAML or JSON file, - stdin.")],
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Override a field: KEY.PATH=VALUE (repeatable)."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the sweep ends.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Start a sweep from a sweep spec file (`name`, `base`, `space`, `metric`, ...).

    Example: `torchyard sweep submit sweep.yaml --set max_trials=32 --wait`
    """
    sweeps = _sweeps(ctx)
    sweep = sweeps.create(apply_overrides(load_spec(spec_path), overrides or []))
    if not json_out:
        err.print(Text(f"sweep {sweep.id} started: {sweep.max_trials} trials"))
    if wait:
        sweep = sweeps.wait(sweep.id)
    if json_out:
        print_json(sweep)
    else:
        out.print(_sweeps_table([sweep]))
    if wait and sweep.state != "succeeded":
        raise typer.Exit(1)


@sweep_app.command("list")
def sweep_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """The project's sweeps, newest first.

    Example: `torchyard sweep list`
    """
    items = _sweeps(ctx).list().items
    if json_out:
        print_json(items)
        return
    out.print(_sweeps_table(items) if items else "no sweeps")


@sweep_app.command("show")
def sweep_show(ctx: typer.Context, sweep_id: SweepArg, json_out: JsonOpt = False) -> None:
    """A sweep: its state, trials by state and best trial.

    Example: `torchyard sweep show 3`
    """
    sweep = _sweeps(ctx).get(sweep_id)
    if json_out:
        print_json(sweep)
        return
    out.print(_sweeps_table([sweep]))
    if sweep.error:
        out.print(Text(f"note: {sweep.error}"))


@sweep_app.command("trials")
def sweep_trials(ctx: typer.Context, sweep_id: SweepArg, json_out: JsonOpt = False) -> None:
    """Every trial of a sweep: values, state, metric, job, where it was pruned.

    Example: `torchyard sweep trials 3`
    """
    trials = _sweeps(ctx).trials(sweep_id)
    if json_out:
        print_json(trials)
    else:
        out.print(_trials_table(trials) if trials else "no trials yet")


@sweep_app.command("best")
def sweep_best(ctx: typer.Context, sweep_id: SweepArg, json_out: JsonOpt = False) -> None:
    """The best completed trial: its values, metric, job and checkpoint (to export).

    Example: `torchyard sweep best 3`
    """
    sweep = _sweeps(ctx).get(sweep_id)
    best = sweep.best
    if json_out:
        print_json(best.model_dump(mode="json") if best else None)
        return
    if best is None:
        out.print(f"sweep {sweep.id} has no completed trial yet ({sweep.state})")
        raise typer.Exit(1)
    metric = sweep.spec.get("metric", "metric")
    out.print(Text(f"trial {best.number}: {metric} {format_value(best.value)}, job {best.job_id}"))
    for path, value in best.params.items():
        out.print(Text(f"  {path} = {_param(value)}"))
    if best.checkpoint_id is None:
        return
    where = f"checkpoint {best.checkpoint_id} (step {best.checkpoint_step})"
    if best.export_refused is not None:  # a LoRA/QLoRA, Hugging Face or script trial
        out.print(Text(f"{where}: not exported by `torchyard export`: {best.export_refused}"))
        return
    command = f"torchyard export {best.job_id} {best.checkpoint_id} --out model.safetensors"
    out.print(Text(f"{where}: {command}"))


@sweep_app.command("cancel")
def sweep_cancel(ctx: typer.Context, sweep_id: SweepArg, json_out: JsonOpt = False) -> None:
    """Cancel a sweep and its queued and running trials.

    Example: `torchyard sweep cancel 3`
    """
    sweep = _sweeps(ctx).cancel(sweep_id)
    if json_out:
        print_json(sweep)
    else:
        out.print(_sweeps_table([sweep]))
