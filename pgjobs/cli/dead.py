"""`pgjobs dead ...`: triage the dead letter (list, show, group, redrive, purge). Every command
that picks dead jobs takes the same filters."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Generator
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pgjobs import admin
from pgjobs.cli import parse, render, render_dead
from pgjobs.cli.options import DsnOption, JobIdArgument, JsonFlag, database, job_ids
from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError

dead_cli = typer.Typer(
    help="Triage dead jobs: list, show, group by error, redrive, purge.", no_args_is_help=True
)

JobIdsArgument = Annotated[
    list[int] | None,
    typer.Argument(help="Job ids (none: every dead job the filters match).", callback=job_ids),
]
QueueFilter = Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")]
TaskFilter = Annotated[str | None, typer.Option("--task", "-t", help="Only this task.")]
SinceFilter = Annotated[
    str | None,
    typer.Option(help="Failed at or after: ISO 8601 with timezone, or an age such as 90m, 2h, 7d."),
]
UntilFilter = Annotated[
    str | None, typer.Option(help="Failed before: ISO 8601 with timezone, or an age (2h = 2h ago).")
]
ErrorFilter = Annotated[
    str | None, typer.Option("--error", "-e", help="Error message contains this (any case).")
]
FingerprintFilter = Annotated[
    str | None,
    typer.Option(help="Error fingerprint, or its 8-digit id, as `pgjobs dead group` shows it."),
]
TagFilter = Annotated[
    list[str] | None,
    typer.Option("--tag", help="Carries this tag; repeat it: jobs carrying every one given."),
]
DryRunFlag = Annotated[
    bool, typer.Option("--dry-run", help="Show what would change; change nothing.")
]
AllFlag = Annotated[
    bool, typer.Option("--all", help="Without ids or filters: every dead job (required then).")
]
BatchSizeOption = Annotated[
    int,
    typer.Option(help="Jobs per transaction; an interruption loses no batch.", min=1, max=100_000),
]


def _filter(
    ids: list[int] | None,
    queue: str | None,
    task: str | None,
    since: str | None,
    until: str | None,
    error: str | None,
    fingerprint: str | None,
    tags: list[str] | None = None,
) -> admin.DeadFilter:
    return admin.DeadFilter(
        ids=tuple(ids) if ids else None,
        queue=queue,
        task=task,
        since=None if since is None else parse.moment("--since", since),
        until=None if until is None else parse.moment("--until", until),
        error=error,
        fingerprint=fingerprint,
        tags=tuple(tags) if tags else None,
    )


@dead_cli.command("list")
def dead_list_command(
    queue: QueueFilter = None,
    task: TaskFilter = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    error: ErrorFilter = None,
    fingerprint: FingerprintFilter = None,
    tag: TagFilter = None,
    limit: Annotated[int, typer.Option(help="Show at most this many.", min=1)] = (
        admin.DEFAULT_LIST_LIMIT
    ),
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Dead jobs, newest first."""
    where = _filter(None, queue, task, since, until, error, fingerprint, tag)
    jobs = admin.dead_jobs(database(dsn), where, limit=limit, tracebacks=as_json)
    if as_json:
        render.print_json([dataclasses.asdict(job) for job in jobs])
        return
    render_dead.dead_jobs(Console(), jobs, limit)


@dead_cli.command("show")
def dead_show_command(
    job_id: JobIdArgument, as_json: JsonFlag = False, dsn: DsnOption = None
) -> None:
    """One dead job: payload, attempts, reason, error and traceback."""
    job = admin.dead_job(database(dsn), job_id)
    if as_json:
        render.print_json(dataclasses.asdict(job))
        return
    typer.echo(f"job {job.id}: dead ({job.reason})")
    render.print_fields(
        [
            ("task", job.task),
            ("queue", job.queue),
            ("payload", json.dumps(job.payload, ensure_ascii=False)),
            ("attempts", f"{job.attempts} of {job.max_attempts}"),
            ("error type", job.error_type),
            ("fingerprint", f"{job.fingerprint}  [{job.fingerprint_id}]"),
            ("created", render.when(job.created_at)),
            ("failed", f"{render.when(job.failed_at)} on worker {job.worker or '-'}"),
            ("redriven", render.redrives(job.redrive_count, job.redriven_at)),
            ("replay of", job.replay_of),
            ("idempotency", job.idempotency_key),
            ("tags", ", ".join(job.tags) or None),
        ]
    )
    render.print_block("error", job.last_error)
    render.print_block("traceback", job.traceback)


@dead_cli.command("group")
def dead_group_command(
    queue: QueueFilter = None,
    task: TaskFilter = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    error: ErrorFilter = None,
    fingerprint: FingerprintFilter = None,
    tag: TagFilter = None,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Dead jobs counted by task and error fingerprint, largest group first."""
    where = _filter(None, queue, task, since, until, error, fingerprint, tag)
    groups = admin.dead_groups(database(dsn), where)
    if as_json:
        render.print_json([dataclasses.asdict(group) for group in groups])
        return
    render_dead.dead_groups(Console(), groups, "dead jobs by task and error")


def _select(
    verb: str, dsn: Dsn, where: admin.DeadFilter, everything: bool, dry_run: bool
) -> admin.DeadSelection | None:
    """The selection to redrive or purge, or None when there is nothing to do (said so)."""
    if where.matches_all and not everything:
        raise ConfigurationError(
            f"name the jobs to {verb}: job ids, or filters (--queue, --task, --since, --until, "
            f"--error, --fingerprint, --tag), or --all for every dead job"
        )
    selection = admin.select_dead(dsn, where)
    if dry_run:
        groups = admin.dead_groups(dsn, selection.filter)
        title = f"dry run: would {verb} {selection.count:,} dead job(s)"
        render_dead.dead_groups(Console(), groups, title)
        return None
    if selection.count == 0:
        typer.echo(f"no dead job matches: nothing to {verb}")
        return None
    return selection


def _run_batches(
    verb: str, past: str, selection: admin.DeadSelection, batches: Generator[list[int], None, None]
) -> None:
    """Drive ``batches`` with a progress bar (on a terminal); Ctrl-C stops between or inside a
    batch, and the batch in flight rolls back whole."""
    done = count = 0
    console = Console(stderr=True)
    progress = Progress(
        TextColumn(f"{past.capitalize()}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )
    try:
        with progress, contextlib.closing(batches):
            bar = progress.add_task(verb, total=selection.count)
            for ids in batches:
                done += len(ids)
                count += 1
                progress.update(bar, completed=done)
    except KeyboardInterrupt:
        render.error(
            f"interrupted: {past} {done:,} of {selection.count:,} job(s) in {count} whole "
            "batch(es); the batch in flight rolled back, so no job is lost or duplicated; "
            "run the command again for the rest"
        )
        raise typer.Exit(130) from None
    typer.echo(f"{past} {done:,} dead job(s) in {count} batch(es)")


@dead_cli.command("redrive")
def dead_redrive_command(
    ids: JobIdsArgument = None,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    error: ErrorFilter = None,
    fingerprint: FingerprintFilter = None,
    tag: TagFilter = None,
    everything: AllFlag = False,
    dry_run: DryRunFlag = False,
    batch_size: BatchSizeOption = admin.DEFAULT_BATCH_SIZE,
    dsn: DsnOption = None,
) -> None:
    """Move dead jobs back to the queue with fresh attempts, ready now."""
    resolved = database(dsn)
    where = _filter(ids, queue, task, since, until, error, fingerprint, tag)
    selection = _select("redrive", resolved, where, everything, dry_run)
    if selection is not None:
        batches = admin.redrive_batches(resolved, selection, batch_size=batch_size)
        _run_batches("redrive", "redrove", selection, batches)


@dead_cli.command("purge")
def dead_purge_command(
    ids: JobIdsArgument = None,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    error: ErrorFilter = None,
    fingerprint: FingerprintFilter = None,
    tag: TagFilter = None,
    everything: AllFlag = False,
    dry_run: DryRunFlag = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    batch_size: BatchSizeOption = admin.DEFAULT_BATCH_SIZE,
    dsn: DsnOption = None,
) -> None:
    """Delete dead jobs for good (asks first unless --yes)."""
    resolved = database(dsn)
    where = _filter(ids, queue, task, since, until, error, fingerprint, tag)
    selection = _select("purge", resolved, where, everything, dry_run)
    if selection is None:
        return
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigurationError(
                f"refusing to purge {selection.count:,} dead job(s) without confirmation: "
                "stdin is not a terminal, pass --yes"
            )
        if not typer.confirm(f"Delete {selection.count:,} dead job(s) for good?", default=False):
            typer.echo("nothing purged")
            raise typer.Exit(1)
    batches = admin.purge_batches(resolved, selection, batch_size=batch_size)
    _run_batches("purge", "purged", selection, batches)
