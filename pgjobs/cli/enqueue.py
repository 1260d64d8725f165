"""`pgjobs enqueue`: one job from the command line."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgjobs import db, enqueue
from pgjobs.app import App
from pgjobs.cli import parse
from pgjobs.cli.messages import warning
from pgjobs.cli.options import (
    NAME_THE_APP,
    DsnOption,
    app_option,
    database,
    find_app,
    use_database,
)
from pgjobs.enqueue import MAX_PAYLOAD_DEPTH
from pgjobs.errors import (
    ConfigurationError,
    DependencyFailed,
    InvalidPayload,
    PgjobsError,
    UnknownDependency,
    UnknownTask,
)
from pgjobs.submission import DEFAULT_QUEUE, check_key, check_seconds, check_unique_options
from pgjobs.tags import check as check_tags
from pgjobs.text import printable

if TYPE_CHECKING:
    import psycopg


def enqueue_command(
    task: Annotated[str, typer.Argument(help="Task name, as registered with @app.task.")],
    payload: Annotated[
        str,
        typer.Option(
            "--payload", "-p", help="JSON object of the handler's arguments; @FILE or @- reads it."
        ),
    ] = "{}",
    queue: Annotated[
        str | None, typer.Option(help="Queue (default: the task's, or 'default').")
    ] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first.", min=-32768, max=32767)] = 0,
    run_at: Annotated[str | None, typer.Option(help="When to run, ISO 8601 with timezone.")] = None,
    delay: Annotated[float | None, typer.Option(help="Run in this many seconds.", min=0)] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="Attempts before dead_letter.", min=1)
    ] = None,
    expires_at: Annotated[
        str | None, typer.Option(help="Archive as expired, unrun, after this time (ISO 8601).")
    ] = None,
    expires_in: Annotated[
        float | None, typer.Option(help="Expire this many seconds from now.", min=0)
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="A second enqueue with this key returns the first job's id.")
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            help="The group it belongs to (a customer, a tenant): a task's or queue's "
            "group concurrency limits each group's running jobs, and claims take turns between "
            "groups."
        ),
    ] = None,
    unique_key: Annotated[
        str | None,
        typer.Option(
            help="While a job of the task with this key has not started, enqueueing another "
            "keeps, replaces or debounces it (--on-conflict) instead of adding a job."
        ),
    ] = None,
    on_conflict: Annotated[
        str | None,
        typer.Option(
            help="With --unique-key: keep (the default: print the existing job's id), replace "
            "(it takes this payload, priority and run time) or debounce (as replace, and it runs "
            "--debounce seconds from now).",
            show_default=False,
        ),
    ] = None,
    debounce: Annotated[
        float | None,
        typer.Option(
            help="With --on-conflict debounce: seconds it waits after the latest enqueue "
            "(default: the task's debounce)."
        ),
    ] = None,
    tag: Annotated[
        list[str] | None,
        typer.Option(
            "--tag", help="A tag to search and triage it by, e.g. customer:42; repeat for more."
        ),
    ] = None,
    after: Annotated[
        list[int] | None,
        typer.Option(
            "--after",
            help="A job it waits for (repeatable, up to 1,000): it runs once every one has "
            "succeeded, and goes to dead_letter unrun (dependency_failed) if one does not.",
            show_default=False,
        ),
    ] = None,
    app_ref: Annotated[
        str | None,
        app_option("holding your tasks: the task's name, queue, defaults and payload are checked"),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Enqueue one job and print its id."""
    arguments = _parse_payload(payload)
    for option, seconds in (("--delay", delay), ("--expires-in", expires_in)):
        if seconds is not None:
            check_seconds(option, seconds)
    if group is not None:
        check_key(group, "group")
    check_unique_options(unique_key, on_conflict, debounce)
    job_tags = check_tags(tag, "--tag")
    run_at_time = None if run_at is None else parse.iso_time("--run-at", run_at)
    expires_at_time = None if expires_at is None else parse.iso_time("--expires-at", expires_at)
    found = find_app(app_ref)
    if found is not None:
        with _bad_input_exits_2():
            check_job(found, task, arguments)
        use_database(found, dsn)
    app = found or App(check_task_names=False)
    if found is None:
        app.bind(database(dsn))
    # One connection for the job and the look for a worker: the app's pool would open two (its
    # probe and its first connection), and the look a third, for two statements.
    with db.target_connection(app.dsn) as conn:
        with _bad_input_exits_2():
            job_id = app.enqueue(
                task,
                arguments,
                queue=queue,
                priority=priority,
                run_at=run_at_time,
                run_in=delay,
                max_attempts=max_attempts,
                expires_at=expires_at_time,
                expires_in=expires_in,
                idempotency_key=idempotency_key,
                group=group,
                unique_key=unique_key,
                on_conflict=on_conflict,
                debounce=debounce,
                tags=job_tags,
                after=after or None,
                connection=conn,
            )
        typer.echo(job_id)
        queue = queue or _task_queue(app, task)
        _warn_if_unserved(conn, app, queue, job_id, app_found=found is not None)


def check_job(app: App, task: str, payload: dict[str, Any]) -> None:
    """Refuse, before anything is written, a payload the handler of ``task`` could not be
    called with: a key it does not take, a value of the wrong type (``InvalidPayload``, as
    ``eager`` refuses it). A task the app does not register is refused by the enqueue itself."""
    declared = app.tasks.get(task)
    if declared is not None:
        enqueue.handler_arguments(declared, payload)


def _task_queue(app: App, task: str) -> str:
    """The queue a job of ``task`` goes to when none is given (as the enqueue decides it)."""
    declared = app.tasks.get(task)
    return declared.queue if declared is not None else DEFAULT_QUEUE


def _warn_if_unserved(
    conn: psycopg.Connection[Any], app: App, queue: str, job_id: int, *, app_found: bool
) -> None:
    """One line on stderr when no live worker serves ``queue``: the job would wait unseen. Only a
    warning: the enqueue is done, and a worker may start later. Without the app, the job went to
    the queue named or to ``default`` (the task's own queue is unknown): the line says how to
    name the app."""
    from pgjobs import stats as read_model  # the dashboard's read model: only for this look

    try:
        with db.translate_errors(app.dsn):
            served = read_model.has_live_worker(conn, queue)
    except PgjobsError:
        return  # the job is enqueued; failing to look for workers must not make that an error
    if not served:
        hint = (
            ""
            if app_found
            else f"; without the app the task's own queue is unknown: {NAME_THE_APP}"
        )
        warning(
            f"no live worker serves queue {printable(queue)!r}: job {job_id} waits until one "
            f"does (pgjobs work --queue {printable(queue)}){hint}"
        )


@contextmanager
def _bad_input_exits_2() -> Iterator[None]:
    """A payload or task name the enqueue refuses is bad input: exit 2, as a bad option is."""
    try:
        yield
    except (InvalidPayload, UnknownTask, UnknownDependency, DependencyFailed) as exc:
        raise ConfigurationError(str(exc)) from None


def _parse_payload(raw: str) -> dict[str, Any]:
    """``--payload``: a JSON object, inline, from a file (``@FILE``) or from stdin (``@-``)."""
    source = "--payload"
    if raw.startswith("@"):
        path = Path(raw[1:])
        source = f"payload file {path}"
        try:
            raw = sys.stdin.read() if raw == "@-" else path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read {source}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigurationError(
                f"{source} is not valid UTF-8 (byte {exc.start}); JSON text must be UTF-8"
            ) from None
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            """pass an object such as '{"user_id": 42}'"""
        ) from None
    except RecursionError:
        raise ConfigurationError(
            f"{source} nests objects and arrays too deeply to read "
            f"(the limit is {MAX_PAYLOAD_DEPTH} levels)"
        ) from None
    if not isinstance(payload, dict):
        raise ConfigurationError(
            f"{source} must be a JSON object (the handler's keyword arguments), "
            f"got {type(payload).__name__}"
        )
    return payload
