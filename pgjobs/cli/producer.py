"""`pgjobs producer`: enqueue a job (or a batch) on an interval, for demos, smoke tests and
synthetic load, until ``--count`` jobs are in or SIGTERM / SIGINT (Ctrl-C) arrives."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from types import FrameType
from typing import Annotated, Any

import typer

from pgjobs.app import App
from pgjobs.cli import parse, render
from pgjobs.cli.enqueue import _parse_payload, check_job
from pgjobs.cli.options import DsnOption, app_option, database, find_app, use_database
from pgjobs.errors import ConfigurationError, InvalidPayload, UnknownTask
from pgjobs.submission import JobSpec
from pgjobs.text import printable

#: Jobs one batch may hold (one INSERT, or COPY from 64 jobs).
MAX_BATCH = 100_000


def producer_command(
    task: Annotated[str, typer.Argument(help="Task name, as registered with @app.task.")],
    payload: Annotated[
        str,
        typer.Option(
            "--payload", "-p", help="JSON object of the handler's arguments; @FILE or @- reads it."
        ),
    ] = "{}",
    every: Annotated[str, typer.Option(help="Interval between batches: 250ms, 2s, 1m, ...")] = "1s",
    count: Annotated[
        int | None,
        typer.Option(help="Stop after this many jobs (default: until SIGTERM or Ctrl-C).", min=1),
    ] = None,
    queue: Annotated[
        str | None, typer.Option(help="Queue (default: the task's, or 'default').")
    ] = None,
    batch: Annotated[
        int, typer.Option(help="Jobs per batch (one statement).", min=1, max=MAX_BATCH)
    ] = 1,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print only the final count.")
    ] = False,
    app_ref: Annotated[
        str | None,
        app_option("holding your tasks: the task's name, queue, defaults and payload are checked"),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Enqueue TASK every --every, --batch jobs at a time, until --count jobs or SIGTERM/Ctrl-C;
    one line per batch, then the total."""
    arguments = _parse_payload(payload)
    period = parse.interval("--every", every).total_seconds()
    found = find_app(app_ref)
    if found is not None:
        try:
            check_job(found, task, arguments)
        except InvalidPayload as exc:
            raise ConfigurationError(str(exc)) from None
        use_database(found, dsn)
    app = found or App(check_task_names=False)
    if found is None:
        app.bind(database(dsn))
    stop = threading.Event()
    total = 0
    with app, _stopped_by_signals(stop):
        try:
            next_at = time.monotonic()
            while not stop.is_set() and (count is None or total < count):
                size = batch if count is None else min(batch, count - total)
                ids = _enqueue(app, [JobSpec(task, arguments, queue=queue)] * size)
                total += len(ids)
                if not quiet:
                    typer.echo(_batch_line(task, ids, total))
                # A fixed rate: a slow batch shortens the wait; a very slow one does not bunch up.
                next_at = max(next_at + period, time.monotonic())
                if count is None or total < count:
                    stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            if total:
                typer.echo(f"produced {total:,} job(s) of {printable(task)}")
    if not total:
        typer.echo("produced 0 job(s)")


def _enqueue(app: App, specs: list[JobSpec]) -> list[int]:
    """Enqueue one batch; a payload or task name the enqueue refuses is bad input (exit 2)."""
    try:
        if len(specs) == 1:
            return [app.enqueue(specs[0].task, specs[0].payload, queue=specs[0].queue)]
        return app.enqueue_many(specs)
    except (InvalidPayload, UnknownTask) as exc:
        raise ConfigurationError(str(exc)) from None


def _batch_line(task: str, ids: list[int], total: int) -> str:
    now = render.cell_time(datetime.now(UTC))
    which = f"id {ids[0]}" if len(ids) == 1 else f"ids {ids[0]}..{ids[-1]}"
    return (
        f"{now} UTC enqueued {len(ids):,} job(s) of {printable(task)} ({which}), {total:,} in all"
    )


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` (the batch under way completes) instead of killing the
    process; the previous handlers come back at the end."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
