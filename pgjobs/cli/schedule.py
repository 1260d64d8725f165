"""`pgjobs schedule`: every periodic schedule in the database, with its next and last run;
`pgjobs schedule pause NAME`, `resume NAME` and `run NAME` (one job now). The work is
``pgjobs.schedules``', which ``/api/v1/schedules`` calls too."""

from __future__ import annotations

from typing import Annotated

import typer

from pgjobs import schedules
from pgjobs import stats as read_model
from pgjobs.cli import render
from pgjobs.cli.options import (
    NAME_THE_APP,
    DsnOption,
    JsonFlag,
    app_option,
    database,
    find_app,
    use_database,
)
from pgjobs.cli.queue import _who
from pgjobs.errors import ConfigurationError
from pgjobs.text import printable

schedule_cli = typer.Typer(
    help="Periodic schedules (@app.periodic). Without a command: list them (expression, "
    "timezone, next and last run in UTC, whether a running worker declares them, paused or "
    "not). Pause, resume or run one now with its command.",
    invoke_without_command=True,
)

ScheduleArgument = Annotated[
    str, typer.Argument(help="The schedule's name (as `pgjobs schedule` lists it).")
]


@schedule_cli.callback()
def schedule_command(
    ctx: typer.Context,
    as_json: JsonFlag = False,
    forget: Annotated[
        str | None,
        typer.Option(
            "--forget",
            help="Delete this schedule's row (one no worker declares any more); a worker that "
            "still declares it records it again, from its next occurrence.",
            show_default=False,
        ),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Periodic schedules (@app.periodic): expression, timezone, next and last run (UTC),
    whether a running worker declares them, and whether they are paused."""
    if ctx.invoked_subcommand is not None:
        return
    resolved = database(dsn)
    if forget is not None:
        schedules.forget(resolved, forget)
        typer.echo(f"schedule {printable(forget)} forgotten")
        return
    found = schedules.list_schedules(resolved)
    if as_json:
        render.print_json([read_model.schedule_json(s) for s in found])
    else:
        render.wide_console().print(render.schedules_table(found))


@schedule_cli.command("pause")
def pause_command(
    name: ScheduleArgument,
    reason: Annotated[
        str | None, typer.Option("--reason", "-r", help="Why (shown by `pgjobs schedule`).")
    ] = None,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Stop enqueueing the schedule's occurrences until it is resumed (from each worker's next
    round of its scheduler). Jobs it enqueued already stay."""
    change = schedules.pause(database(dsn), name, reason=reason, by=_who())
    _report(change, as_json, "paused" if change.changed else "was already paused")


@schedule_cli.command("resume")
def resume_command(
    name: ScheduleArgument, as_json: JsonFlag = False, dsn: DsnOption = None
) -> None:
    """Enqueue the schedule's occurrences again; those missed while it was paused run as its
    catch_up rule says (last: the latest one; skip: none; N: the latest N)."""
    change = schedules.resume(database(dsn), name)
    _report(change, as_json, "resumed" if change.changed else "was not paused")


@schedule_cli.command("run")
def run_command(
    name: ScheduleArgument,
    app_ref: Annotated[
        str | None, app_option("declaring the schedule (its task, payload and options)")
    ] = None,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Enqueue one job of the schedule now, as its occurrences are (task, payload, queue,
    priority, attempts), outside its cadence: its next occurrence stays, a paused schedule
    stays paused."""
    app = find_app(app_ref)
    if app is None:
        raise ConfigurationError(
            f"running a schedule needs the app that declares it: {NAME_THE_APP}", field="app"
        )
    use_database(app, dsn)
    run = schedules.run_now(app.dsn, name, app.periodics, app.enqueue_many)
    if as_json:
        schedule = None if run.schedule is None else read_model.schedule_json(run.schedule)
        render.print_json({"name": run.name, "job_id": run.job_id, "schedule": schedule})
        return
    typer.echo(f"schedule {printable(run.name)} run now: job {run.job_id} enqueued")


def _report(change: schedules.ScheduleChange, as_json: bool, done: str) -> None:
    if as_json:
        render.print_json(
            {"changed": change.changed, "schedule": read_model.schedule_json(change.schedule)}
        )
        return
    schedule = change.schedule
    line = f"schedule {printable(schedule.name)} {done}"
    if schedule.paused:
        line += (
            f" (since {render.when(schedule.paused_at)}, by {printable(schedule.paused_by or '-')})"
        )
    typer.echo(line)
