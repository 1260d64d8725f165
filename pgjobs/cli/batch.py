"""`pgjobs batch show`: a batch's counts, its callback and its members by status."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from pgjobs import batches
from pgjobs.cli import render
from pgjobs.cli.options import DsnOption, JsonFlag, database
from pgjobs.errors import BatchNotFound
from pgjobs.models import JobStatus
from pgjobs.submission import MAX_JOB_ID

batch_cli = typer.Typer(help="Look at batches (app.batch).", no_args_is_help=True)


def _batch_id(value: int) -> int:
    if not 1 <= value <= MAX_JOB_ID:
        raise typer.BadParameter(f"{value} is out of range: batch ids are 1..{MAX_JOB_ID}")
    return value


BatchIdArgument = Annotated[
    int, typer.Argument(help="The batch id.", show_default=False, callback=_batch_id)
]


@batch_cli.command("show")
def batch_show_command(
    batch_id: BatchIdArgument, as_json: JsonFlag = False, dsn: DsnOption = None
) -> None:
    """A batch: how many members ended and how (their first end, as the callback is told),
    where its members are now, and its callback job. Exit 2 for an unknown batch."""
    try:
        status = batches.status(database(dsn), batch_id)
    except BatchNotFound as exc:
        render.error(str(exc))
        raise typer.Exit(2) from None
    if as_json:
        render.print_json(dataclasses.asdict(status))
        return
    state = "complete" if status.complete else f"{status.pending} of {status.total} pending"
    typer.echo(f"batch {status.id}: {state}")
    callback = None
    if status.callback_task is not None:
        callback = f"{status.callback_task} on queue {status.callback_queue}"
        callback += (
            f", job {status.callback_job_id}"
            if status.callback_job_id is not None
            else " (enqueued when the last member ends)"
        )
    render.print_fields(
        [
            ("members", status.total),
            ("succeeded", status.succeeded),
            ("dead", status.dead),
            ("cancelled", status.cancelled),
            ("created", render.when(status.created_at)),
            ("completed", render.when(status.completed_at) if status.complete else None),
            ("callback", callback or "none"),
            ("now", members_text(status.members) or None),
        ]
    )


def members_text(members: dict[str, int]) -> str:
    """``"3 ready, 1 running, 20 succeeded"``: members per status, in the order of JobStatus."""
    return ", ".join(f"{members[s]} {s}" for s in JobStatus if members.get(s))
