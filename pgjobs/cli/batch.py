"""`pgjobs batch show`: a batch's counts, its callback and its members by status; `pgjobs batch
results`: its members' outcomes and results, a page at a time."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from pgjobs import batches, db, flow
from pgjobs.cli import render
from pgjobs.cli.options import DsnOption, JsonFlag, database
from pgjobs.errors import BatchNotFound
from pgjobs.models import JobStatus
from pgjobs.submission import MAX_JOB_ID
from pgjobs.text import clipped, printable

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


#: Bytes of one member's result or error `batch results` prints (``--json`` gives the whole).
_SHOWN = 200


@batch_cli.command("results")
def batch_results_command(
    batch_id: BatchIdArgument,
    after: Annotated[
        int, typer.Option(min=0, help="Start after this member id (the `next` line's).")
    ] = 0,
    limit: Annotated[
        int, typer.Option(min=1, max=flow.MAX_PAGE_SIZE, help="Members per page.")
    ] = 100,
    every: Annotated[
        bool, typer.Option("--all", help="Every member, page after page (one in memory).")
    ] = False,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """A batch's members in id order with their outcomes: a succeeded one's result, a dead
    one's reason and error. One page (``--limit``) and the command for the next; ``--all`` for
    every page. Exit 2 for an unknown batch."""
    try:
        with db.target_connection(database(dsn)) as conn:
            while True:
                page = flow.batch_page(conn, batch_id, after, limit)
                _print_page(page, as_json)
                if page.next_after is None or not every:
                    break
                after = page.next_after
    except BatchNotFound as exc:
        render.error(str(exc))
        raise typer.Exit(2) from None
    if page.next_after is not None and not every and not as_json:
        typer.echo(f"next: pgjobs batch results {batch_id} --after {page.next_after}")


def _print_page(page: flow.ResultsPage, as_json: bool) -> None:
    if as_json:
        render.print_json(
            {
                "results": [dataclasses.asdict(m) for m in page.results],
                "next_after": page.next_after,
            }
        )
        return
    for member in page.results:
        if member.succeeded:
            what = (
                ""
                if member.result is None
                else clipped(render.json_text(member.result, indent=None), _SHOWN)
            )
        elif member.status is JobStatus.DEAD:
            error = member.last_error  # its type first, as the worker wrote it
            what = f"{member.reason}" + (f": {clipped(error, _SHOWN)}" if error else "")
        else:
            what = ""
        line = f"{member.id:>12}  {member.status or 'purged':<10} {member.task or ''}  {what}"
        typer.echo(printable(line.rstrip()))
