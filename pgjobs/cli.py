"""The `pgjobs` command: the only module that wires everything together."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pgjobs import db, migrate, queries
from pgjobs.app import App
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.models import QueueStats
from pgjobs.tasks import JobSpec
from pgjobs.worker import Worker, WorkerConfig

cli = typer.Typer(
    name="pgjobs",
    help="A durable background-job queue backed by PostgreSQL alone.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="PostgreSQL URL. Default: $PGJOBS_DATABASE_URL, then $DATABASE_URL, "
        "then the embedded server (pgjobs[embedded]).",
        show_default=False,
    ),
]


def _dsn(raw: str | None) -> db.Dsn:
    return db.resolve_dsn(raw)


@cli.command("migrate")
def migrate_command(
    dsn: DsnOption = None,
    revision: Annotated[
        str, typer.Option(help="Revision to upgrade to (or the range to print with --sql).")
    ] = "head",
    downgrade: Annotated[
        str | None,
        typer.Option(help="Downgrade to this revision instead ('base' removes pgjobs' tables)."),
    ] = None,
    sql: Annotated[
        bool, typer.Option("--sql", help="Print the DDL instead of running it (no database).")
    ] = False,
    current: Annotated[
        bool, typer.Option("--current", help="Print the database's revision and exit.")
    ] = False,
    check: Annotated[
        bool,
        typer.Option("--check", help="Exit 1 when the database is behind pgjobs' newest revision."),
    ] = False,
) -> None:
    """Create or upgrade pgjobs' tables (Alembic, shipped inside the package)."""
    if sql:
        target = downgrade if downgrade is not None else revision
        if downgrade is not None and ":" not in target:
            target = f"{migrate.head()}:{target}"
        sys.stdout.write(migrate.sql(target, downgrade=downgrade is not None))
        return
    resolved = _dsn(dsn)
    if current or check:
        now = migrate.current(resolved)
        head = migrate.head()
        typer.echo(f"current: {now or 'none (run `pgjobs migrate`)'}  head: {head}")
        if check and now != head:
            raise typer.Exit(1)
        return
    if downgrade is not None:
        migrate.downgrade(resolved, downgrade)
        typer.echo(f"pgjobs schema downgraded to {downgrade} in {resolved.redacted}")
        return
    migrate.upgrade(resolved, revision)
    typer.echo(f"pgjobs schema is at {migrate.current(resolved)} in {resolved.redacted}")


def _parse_time(option: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigurationError(
            f"{option} {value!r} is not an ISO 8601 time, e.g. 2026-11-21T15:00:00+00:00"
        ) from None
    if parsed.tzinfo is None:
        raise ConfigurationError(f"{option} {value!r} has no timezone: add one, e.g. {value}+00:00")
    return parsed


def _parse_payload(raw: str) -> dict[str, Any]:
    source = "--payload"
    if raw.startswith("@"):
        path = Path(raw[1:])
        source = f"payload file {path}"
        try:
            raw = sys.stdin.read() if raw == "@-" else path.read_text()
        except OSError as exc:
            raise ConfigurationError(f"cannot read {source}: {exc.strerror}") from None
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            """pass an object such as '{"user_id": 42}'"""
        ) from None
    if not isinstance(payload, dict):
        raise ConfigurationError(
            f"{source} must be a JSON object (the handler's keyword arguments), "
            f"got {type(payload).__name__}"
        )
    return payload


def _load_app(reference: str) -> App:
    module_name, _, attribute = reference.partition(":")
    if not module_name:
        raise ConfigurationError(f"--app {reference!r}: expected package.module:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"--app {reference!r}: cannot import {module_name}: {exc}"
        ) from None
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, App):
        raise ConfigurationError(
            f"--app {reference!r}: {module_name} has no pgjobs.App named {attribute or 'app'!r}"
        )
    return app


@cli.command("enqueue")
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
    app_ref: Annotated[
        str | None,
        typer.Option(
            "--app", help="package.module:app, to check the task name and use its defaults."
        ),
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Enqueue one job and print its id."""
    spec = JobSpec(
        task,
        _parse_payload(payload),
        queue=queue,
        priority=priority,
        run_at=_parse_time("--run-at", run_at),
        run_in=delay,
        max_attempts=max_attempts,
        expires_at=_parse_time("--expires-at", expires_at),
        expires_in=expires_in,
        idempotency_key=idempotency_key,
    )
    app = _load_app(app_ref) if app_ref else App(check_task_names=False)
    if dsn or app_ref is None:
        app.bind(_dsn(dsn))
    with app:
        typer.echo(app.enqueue_many([spec])[0])


@cli.command("work")
def work_command(
    app_ref: Annotated[str, typer.Option("--app", help="package.module:app holding your tasks.")],
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", help="Jobs run at once.", min=1, max=10_000)
    ] = 8,
    queues: Annotated[
        list[str] | None,
        typer.Option(
            "--queue", "-q", help="Queue to work (repeatable). Default: the tasks' queues."
        ),
    ] = None,
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between polls when no NOTIFY arrives.", min=0.01)
    ] = 1.0,
    grace: Annotated[
        float, typer.Option(help="Seconds running jobs get to finish after SIGTERM.", min=0)
    ] = 30.0,
    burst: Annotated[
        bool, typer.Option("--burst", help="Exit once the queues hold no job.")
    ] = False,
    maintenance: Annotated[
        bool, typer.Option(help="Run the lease rescuer and expirer in this worker.")
    ] = True,
    rescue_interval: Annotated[
        float,
        typer.Option(help="Seconds between lease-rescuer rounds (expired leases freed).", min=0.1),
    ] = 15.0,
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error.", case_sensitive=False)
    ] = "info",
    dsn: DsnOption = None,
) -> None:
    """Run workers: claim jobs, run their handlers, record the outcomes."""
    level = logging.getLevelNamesMapping().get(log_level.upper())
    if level is None:
        raise ConfigurationError(f"--log-level {log_level!r}: use debug, info, warning or error")
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    app = _load_app(app_ref)
    if dsn:
        app.bind(_dsn(dsn))
    config = WorkerConfig(
        concurrency=concurrency,
        queues=queues or None,
        poll_interval=poll_interval,
        grace=grace,
        burst=burst,
        maintenance=maintenance,
        rescue_interval=rescue_interval,
    )
    raise typer.Exit(Worker(app, config).run())


@cli.command("stats")
def stats_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Per-queue counts: ready, scheduled, running, dead, finished in the last hour."""
    resolved = _dsn(dsn)
    with db.connect(resolved) as conn:
        rows = db.fetch_all(conn, queries.QUEUE_STATS)
    stats = [QueueStats(*row) for row in rows]
    if as_json:
        typer.echo(json.dumps([_stats_dict(s) for s in stats], indent=2))
        return
    table = Table(title=f"pgjobs queues ({resolved.redacted})")
    for column in ("queue", "ready", "scheduled", "running", "dead", "finished 1h", "failed 1h"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    table.add_column("oldest ready", justify="right")
    for s in stats:
        table.add_row(
            s.queue,
            f"{s.ready:,}",
            f"{s.scheduled:,}",
            f"{s.running:,}",
            f"[red]{s.dead:,}[/red]" if s.dead else "0",
            f"{s.finished_last_hour:,}",
            f"{s.failed_last_hour:,}",
            _age(s.oldest_ready_age),
        )
    if not stats:
        table.caption = "no jobs yet"
    Console().print(table)


def _stats_dict(stats: QueueStats) -> dict[str, Any]:
    return dataclasses.asdict(stats)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; every error is one line on stderr."""
    try:
        result = cli(
            args=list(argv) if argv is not None else None, prog_name="pgjobs", standalone_mode=False
        )
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # usage errors: bad option values, unknown commands
        _error(exc.format_message())
        return exc.exit_code
    except typer.Abort:
        _error("aborted")
        return 130
    except ConfigurationError as exc:
        _error(str(exc))
        return 2
    except PgjobsError as exc:
        _error(str(exc))
        return 1
    return result if isinstance(result, int) else 0


def _error(message: str) -> None:
    print(f"pgjobs: error: {' '.join(message.split())}", file=sys.stderr)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
