"""`pgjobs schedule`: every periodic schedule in the database, with its next and last run."""

from __future__ import annotations

from typing import Annotated

import typer

from pgjobs import db, queues
from pgjobs import stats as read_model
from pgjobs.cli import render
from pgjobs.cli.options import DsnOption, JsonFlag, database
from pgjobs.text import printable


def schedule_command(
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
    """Periodic schedules (@app.periodic): expression, timezone, next and last run (UTC), and
    whether a running worker declares them."""
    resolved = database(dsn)
    if forget is not None:
        queues.forget_schedule(resolved, forget)
        typer.echo(f"schedule {printable(forget)} forgotten")
        return
    with db.connect(resolved) as conn:
        found = read_model.schedules(conn)
    if as_json:
        render.print_json([read_model.schedule_json(s) for s in found])
    else:
        render.wide_console().print(render.schedules_table(found))
