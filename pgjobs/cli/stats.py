"""`pgjobs stats`: the queues, the live workers and (``--verbose``) the tables' health; once, or
redrawn in place under ``--watch``."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from pgjobs import db, groups
from pgjobs import stats as read_model
from pgjobs.cli import render
from pgjobs.cli.options import DsnOption, app_option, database, load_app
from pgjobs.db.dsn import Dsn
from pgjobs.errors import PgjobsError
from pgjobs.tasks import Task


def stats_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Also the tables' health: dead rows, autovacuum, sizes."
        ),
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh in place until Ctrl-C.")
    ] = False,
    interval: Annotated[
        float, typer.Option(help="Seconds between refreshes with --watch.", min=0.1)
    ] = 2.0,
    app_ref: Annotated[
        str | None,
        app_option(
            "holding your tasks: their group_concurrency and ordered tell which groups are at "
            "their limit, beside the queue's, and what holds an ordered task's groups",
            found=False,
        ),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Per queue: ready, scheduled, running, dead, finished in the last hour, throughput and retry
    rate over the last minute, oldest ready job; the live workers and what each one runs; for
    queues with grouped jobs, the groups with the most ready jobs and how many are at their
    limit."""
    resolved = database(dsn)
    title = f"pgjobs queues ({resolved.redacted})"
    tasks = _app_tasks(app_ref)
    limits = None if tasks is None else groups.task_limits(tasks)
    ordered = None if tasks is None else groups.ordered_tasks(tasks)
    if not watch:
        with db.connect(resolved) as conn:
            snap = read_model.snapshot(
                conn, verbose=verbose, group_limits=limits, ordered_tasks=ordered
            )
        if as_json:
            render.print_json(read_model.as_json(snap, verbose=verbose))
        else:
            render.wide_console().print(render.stats(snap, title, verbose=verbose))
        return
    _watch(
        resolved,
        title,
        verbose=verbose,
        as_json=as_json,
        interval=interval,
        limits=limits,
        ordered=ordered,
    )


def _app_tasks(app_ref: str | None) -> list[Task] | None:
    """The tasks (their own group limits, which are ordered) of the app ``--app`` names, or None
    without it. Stats imports an app only when asked: what it reads otherwise is the database,
    so it never runs the code $PGJOBS_APP or pyproject.toml names. Groups are then judged by
    their queue's group concurrency alone."""
    return None if app_ref is None else list(load_app(app_ref).tasks.values())


def _watch(
    dsn: Dsn,
    title: str,
    *,
    verbose: bool,
    as_json: bool,
    interval: float,
    limits: dict[str, int] | None,
    ordered: dict[str, bool | str] | None,
) -> None:
    """Redraw the stats every ``interval`` seconds (JSON: one line per reading) until Ctrl-C.
    A lost database shows as a line under the last reading; the next refresh reconnects."""
    conn: Any = None
    last: RenderableType = Text("connecting...")

    def reading() -> RenderableType:
        nonlocal conn, last
        try:
            if conn is None or conn.closed:
                conn = db.connect(dsn)
            snap = read_model.snapshot(
                conn, verbose=verbose, group_limits=limits, ordered_tasks=ordered
            )
        except PgjobsError as exc:
            if conn is not None:
                conn.close()
            conn = None
            if as_json:
                typer.echo(render.json_text({"error": str(exc)}, indent=None))
            return Group(last, Text(f"{_clock()} {exc}", style="bold red"))
        if as_json:
            typer.echo(render.json_text(read_model.as_json(snap, verbose=verbose), indent=None))
        last = render.stats(snap, f"{title} at {_clock()}", verbose=verbose)
        return last

    try:
        if as_json:
            while True:
                reading()
                time.sleep(interval)
        with Live(reading(), auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(reading(), refresh=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends watching: exit 0
    finally:
        if conn is not None:
            conn.close()


def _clock() -> str:
    """The time of a reading, as every time prints: in UTC."""
    return f"{render.cell_time(datetime.now(UTC))} UTC"
