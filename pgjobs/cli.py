"""The `pgjobs` command: the only module that wires everything together."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Generator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from pgjobs import admin, db, migrate, retention, supervisor
from pgjobs import stats as stats_view
from pgjobs.app import App
from pgjobs.dsn import Dsn, resolve_dsn
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.models import DeadGroup, JobStatus, QueueStats
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


def _dsn(raw: str | None) -> Dsn:
    return resolve_dsn(raw)


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
    lock_timeout: Annotated[
        str | None,
        typer.Option(
            help="Longest wait for a lock per statement, e.g. 5s, 500ms; 0 waits forever. "
            "Default: 5s.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Create or upgrade pgjobs' tables (Alembic, shipped inside the package)."""
    if sql:
        target = downgrade if downgrade is not None else revision
        if downgrade is not None and ":" not in target:
            target = f"{migrate.head()}:{target}"
        sys.stdout.write(
            migrate.sql(target, downgrade=downgrade is not None, lock_timeout=lock_timeout)
        )
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
        migrate.downgrade(resolved, downgrade, lock_timeout=lock_timeout)
        typer.echo(f"pgjobs schema downgraded to {downgrade} in {resolved.redacted}")
        return
    migrate.upgrade(resolved, revision, lock_timeout=lock_timeout)
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
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            help="Worker processes to run, each with --concurrency slots; above 1, this "
            "process supervises them.",
            min=1,
        ),
    ] = 1,
    supervisor_fd: Annotated[
        int | None, typer.Option("--supervisor-fd", hidden=True, help="Set by --processes.")
    ] = None,
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
    config = WorkerConfig(
        concurrency=concurrency,
        queues=queues or None,
        poll_interval=poll_interval,
        grace=grace,
        burst=burst,
        maintenance=maintenance,
        rescue_interval=rescue_interval,
    )
    # A worker process started by --processes: the supervisor resolved the database.
    link = supervisor.SupervisorLink(supervisor_fd) if supervisor_fd is not None else None
    app = _load_app(app_ref)
    if link is not None:
        app.bind(link.dsn)
    elif dsn:
        app.bind(_dsn(dsn))
    if processes > 1:
        # Resolved once, here, as a single worker would (--dsn, else the app's own, else the
        # environment, else the embedded server, started once for all worker processes).
        command = [sys.executable, "-m", "pgjobs", *_work_argv(app_ref, config, log_level)]
        raise typer.Exit(
            supervisor.Supervisor(command, app.dsn, processes, burst=config.burst).run()
        )
    raise typer.Exit(Worker(app, config).run(on_checked=link.ready if link else None))


def _work_argv(app_ref: str, config: WorkerConfig, log_level: str) -> list[str]:
    """The `pgjobs work` arguments of one worker process that runs as ``config`` says (for
    --processes; the database is handed over separately). ``--option=value`` throughout, so that
    a value starting with "-" stays a value."""
    argv = [
        "work",
        f"--app={app_ref}",
        f"--concurrency={config.concurrency}",
        f"--poll-interval={config.poll_interval!r}",
        f"--grace={config.grace!r}",
        f"--rescue-interval={config.rescue_interval!r}",
        f"--log-level={log_level}",
        "--maintenance" if config.maintenance else "--no-maintenance",
    ]
    argv += [f"--queue={queue}" for queue in config.queues or ()]
    if config.burst:
        argv.append("--burst")
    return argv


@cli.command("stats")
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
    dsn: DsnOption = None,
) -> None:
    """Per queue: ready, scheduled, running, dead, finished in the last hour, throughput and retry
    rate over the last minute, oldest ready job; the live workers and what each one runs."""
    resolved = _dsn(dsn)
    title = f"pgjobs queues ({resolved.redacted})"
    if not watch:
        with db.connect(resolved) as conn:
            snap = stats_view.snapshot(conn, verbose=verbose)
        if as_json:
            typer.echo(json.dumps(stats_view.as_json(snap, verbose=verbose), indent=2, default=str))
        else:
            _wide_console().print(stats_view.render(snap, title, verbose=verbose))
        return
    _watch_stats(resolved, title, verbose=verbose, as_json=as_json, interval=interval)


def _watch_stats(dsn: Dsn, title: str, *, verbose: bool, as_json: bool, interval: float) -> None:
    """Redraw the stats every ``interval`` seconds (JSON: one line per reading) until Ctrl-C.
    A lost database shows as a line under the last reading; the next refresh reconnects."""
    conn: Any = None
    last: RenderableType = Text("connecting...")

    def reading() -> RenderableType:
        nonlocal conn, last
        try:
            if conn is None or conn.closed:
                conn = db.connect(dsn)
            snap = stats_view.snapshot(conn, verbose=verbose)
        except PgjobsError as exc:
            if conn is not None:
                conn.close()
            conn = None
            if as_json:
                typer.echo(json.dumps({"error": str(exc)}))
            return Group(last, Text(f"{datetime.now():%H:%M:%S} {exc}", style="bold red"))
        if as_json:
            typer.echo(json.dumps(stats_view.as_json(snap, verbose=verbose), default=str))
        last = stats_view.render(snap, f"{title} at {datetime.now():%H:%M:%S}", verbose=verbose)
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


def _wide_console() -> Console:
    """A console for tables: as wide as the terminal, or 140 columns into a pipe or file
    (rich's default of 80 would cut the headers of the stats tables)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=140)
    return console


def _stats_dict(stats: QueueStats) -> dict[str, Any]:
    return stats_view.queue_json(stats)


@cli.command("prune")
def prune_command(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Drop the archive partitions whose jobs all finished longer ago than this: "
            "30d, 12h, 2w...",
            show_default=False,
        ),
    ],
    export: Annotated[
        Path | None,
        typer.Option(
            help="Copy each partition out before dropping it: into FOLDER/<partition>.csv when "
            "this is a folder, else appended to this file.",
            metavar="FILE|FOLDER",
        ),
    ] = None,
    export_format: Annotated[
        str, typer.Option("--format", help="Export format: csv (with a header) or text (COPY's).")
    ] = "csv",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be dropped; drop nothing.")
    ] = False,
    lock_timeout: Annotated[
        float,
        typer.Option(help="Seconds to wait for the lock on archived_jobs per attempt.", min=0.01),
    ] = 2.0,
    dsn: DsnOption = None,
) -> None:
    """Drop whole partitions of archived_jobs older than a cutoff (optionally exported first)."""
    age = retention.parse_age(older_than)
    resolved = _dsn(dsn)
    verb = "would drop" if dry_run else "dropped"

    def report(done: retention.PrunedPartition) -> None:
        p = done.partition
        since = "the beginning" if p.lower is None else _when(p.lower)
        line = f"{verb} {p.name} ({since} .. {_when(p.upper)}): {done.rows:,} rows"
        if done.exported_to is not None:
            line += f", exported to {done.exported_to}"
        typer.echo(line)

    result = retention.prune(
        resolved,
        age,
        export=export,
        export_format=export_format,
        dry_run=dry_run,
        lock_timeout=lock_timeout,
        on_pruned=report,
    )
    typer.echo(
        f"{verb} {len(result.pruned)} partition(s), {result.rows:,} rows finished before "
        f"{_when(result.cutoff)}"
    )
    for p in result.straddling:
        typer.echo(
            f"kept {p.name}: it also holds jobs finished after the cutoff (until "
            f"{_when(p.upper)}); it goes once all of them are older than {older_than}"
        )
    if result.default_rows_older:
        typer.echo(
            f"kept {result.default_rows_older:,} old row(s) of the DEFAULT partition: workers "
            "move them into partitions of their own days, which the next prune drops"
        )


# -- dead letter triage, job lookup and control (pgjobs.admin) --------------------------------

dead_cli = typer.Typer(
    help="Triage dead jobs: list, show, group by error, redrive, purge.", no_args_is_help=True
)
job_cli = typer.Typer(help="Look up one job wherever it is.", no_args_is_help=True)
cli.add_typer(dead_cli, name="dead")
cli.add_typer(job_cli, name="job")

JobIdArgument = Annotated[int, typer.Argument(help="The job id.", show_default=False)]
JobIdsArgument = Annotated[
    list[int] | None, typer.Argument(help="Job ids (none: every dead job the filters match).")
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
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
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

_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse_moment(option: str, value: str | None) -> datetime | None:
    """An ISO 8601 time, or an age ("90m", "2h", "7d": that long before now)."""
    if value is None:
        return None
    number, unit = value[:-1], value[-1:].lower()
    if unit in _AGE_UNITS and number.replace(".", "", 1).isdigit():
        return datetime.now(UTC) - timedelta(seconds=float(number) * _AGE_UNITS[unit])
    return _parse_time(option, value)


def _dead_filter(
    ids: list[int] | None,
    queue: str | None,
    task: str | None,
    since: str | None,
    until: str | None,
    error: str | None,
    fingerprint: str | None,
) -> admin.DeadFilter:
    return admin.DeadFilter(
        ids=tuple(ids) if ids else None,
        queue=queue,
        task=task,
        since=_parse_moment("--since", since),
        until=_parse_moment("--until", until),
        error=error,
        fingerprint=fingerprint,
    )


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=_json_value))


def _when(value: datetime | None) -> str:
    """A time in UTC to the second: "2026-11-21 15:34:54 UTC"."""
    return "-" if value is None else f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _cell_time(value: datetime) -> str:
    """A time for a table cell (the header says UTC): the time alone when it is today."""
    value = value.astimezone(UTC)
    if value.date() == datetime.now(UTC).date():
        return f"{value:%H:%M:%S}"
    return f"{value:%Y-%m-%d %H:%M}"


def _print_fields(fields: list[tuple[str, Any]]) -> None:
    for name, value in fields:
        if value is not None:
            typer.echo(f"  {name:<13}{value}")


def _print_block(title: str, text: str | None) -> None:
    if text:
        typer.echo(f"{title}:")
        for line in text.rstrip("\n").splitlines():
            typer.echo(f"  {line}")


def _redrives(count: int, last: datetime | None) -> str | None:
    return None if count == 0 else f"{count} time(s), last at {_when(last)}"


@dead_cli.command("list")
def dead_list_command(
    queue: QueueFilter = None,
    task: TaskFilter = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    error: ErrorFilter = None,
    fingerprint: FingerprintFilter = None,
    limit: Annotated[int, typer.Option(help="Show at most this many.", min=1)] = (
        admin.DEFAULT_LIST_LIMIT
    ),
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Dead jobs, newest first."""
    where = _dead_filter(None, queue, task, since, until, error, fingerprint)
    jobs = admin.dead_jobs(_dsn(dsn), where, limit=limit)
    if as_json:
        _print_json([dataclasses.asdict(job) for job in jobs])
        return
    table = Table(title="dead jobs, newest first (times in UTC)", box=box.SIMPLE_HEAD)
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("failed")
    table.add_column("queue")
    table.add_column("task", overflow="fold")
    table.add_column("tries", justify="right", no_wrap=True)
    table.add_column("reason")
    table.add_column("error", overflow="fold")
    for job in jobs:
        table.add_row(
            str(job.id),
            _cell_time(job.failed_at),
            escape(job.queue),
            escape(job.task),
            f"{job.attempts}/{job.max_attempts}",
            job.reason,
            escape(job.last_error or ""),
        )
    table.caption = "no dead job matches" if not jobs else f"{len(jobs)} shown (--limit {limit})"
    Console().print(table)


@dead_cli.command("show")
def dead_show_command(
    job_id: JobIdArgument, as_json: JsonFlag = False, dsn: DsnOption = None
) -> None:
    """One dead job: payload, attempts, reason, error and traceback."""
    job = admin.dead_job(_dsn(dsn), job_id)
    if as_json:
        _print_json(dataclasses.asdict(job))
        return
    typer.echo(f"job {job.id}: dead ({job.reason})")
    _print_fields(
        [
            ("task", job.task),
            ("queue", job.queue),
            ("payload", json.dumps(job.payload, ensure_ascii=False)),
            ("attempts", f"{job.attempts} of {job.max_attempts}"),
            ("error type", job.error_type),
            ("fingerprint", f"{job.fingerprint}  [{job.fingerprint_id}]"),
            ("created", _when(job.created_at)),
            ("failed", f"{_when(job.failed_at)} on worker {job.worker or '-'}"),
            ("redriven", _redrives(job.redrive_count, job.redriven_at)),
            ("replay of", job.replay_of),
            ("idempotency", job.idempotency_key),
        ]
    )
    _print_block("error", job.last_error)
    _print_block("traceback", job.traceback)


@dead_cli.command("group")
def dead_group_command(
    queue: QueueFilter = None,
    task: TaskFilter = None,
    since: SinceFilter = None,
    until: UntilFilter = None,
    error: ErrorFilter = None,
    as_json: JsonFlag = False,
    dsn: DsnOption = None,
) -> None:
    """Dead jobs counted by task and error fingerprint, largest group first."""
    where = _dead_filter(None, queue, task, since, until, error, None)
    groups = admin.dead_groups(_dsn(dsn), where)
    if as_json:
        _print_json([dataclasses.asdict(group) for group in groups])
        return
    _print_groups(groups, "dead jobs by task and error")


def _print_groups(groups: list[DeadGroup], title: str) -> None:
    table = Table(title=f"{title} (times in UTC)", box=box.SIMPLE_HEAD)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("task", overflow="fold")
    table.add_column("error fingerprint", overflow="fold")
    table.add_column("id", no_wrap=True)
    table.add_column("first failed")
    table.add_column("last failed")
    for group in groups:
        table.add_row(
            f"{group.count:,}",
            escape(group.task),
            escape(group.fingerprint),
            group.fingerprint_id,
            _cell_time(group.first_failed_at),
            _cell_time(group.last_failed_at),
        )
    total = sum(group.count for group in groups)
    table.caption = f"{total:,} dead job(s) in {len(groups):,} group(s)"
    Console().print(table)


def _select(
    verb: str, dsn: Dsn, where: admin.DeadFilter, everything: bool, dry_run: bool
) -> admin.DeadSelection | None:
    """The selection to redrive or purge, or None when there is nothing to do (said so)."""
    if where.matches_all and not everything:
        raise ConfigurationError(
            f"name the jobs to {verb}: job ids, or filters (--queue, --task, --since, --until, "
            f"--error, --fingerprint), or --all for every dead job"
        )
    selection = admin.select_dead(dsn, where)
    if dry_run:
        groups = admin.dead_groups(dsn, selection.filter)
        _print_groups(groups, f"dry run: would {verb} {selection.count:,} dead job(s)")
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
        _error(
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
    everything: AllFlag = False,
    dry_run: DryRunFlag = False,
    batch_size: BatchSizeOption = admin.DEFAULT_BATCH_SIZE,
    dsn: DsnOption = None,
) -> None:
    """Move dead jobs back to the queue with fresh attempts, ready now."""
    resolved = _dsn(dsn)
    where = _dead_filter(ids, queue, task, since, until, error, fingerprint)
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
    everything: AllFlag = False,
    dry_run: DryRunFlag = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    batch_size: BatchSizeOption = admin.DEFAULT_BATCH_SIZE,
    dsn: DsnOption = None,
) -> None:
    """Delete dead jobs for good (asks first unless --yes)."""
    resolved = _dsn(dsn)
    where = _dead_filter(ids, queue, task, since, until, error, fingerprint)
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


@job_cli.command("show")
def job_show_command(
    job_id: JobIdArgument, as_json: JsonFlag = False, dsn: DsnOption = None
) -> None:
    """A job wherever it is (queued, archived or dead), and its whole story."""
    job = admin.job(_dsn(dsn), job_id)
    if as_json:
        _print_json(dataclasses.asdict(job))
        return
    detail = job.reason if job.reason else job.table
    typer.echo(f"job {job.id}: {job.status} ({detail})")
    running = None
    if job.lease_owner is not None:
        running = f"on worker {job.lease_owner}, lease until {_when(job.lease_expires_at)}"
    finished = None
    if job.finished_at is not None:
        finished = _when(job.finished_at) + (f" on worker {job.worker}" if job.worker else "")
    _print_fields(
        [
            ("task", job.task),
            ("queue", job.queue),
            ("priority", job.priority or None),
            ("payload", json.dumps(job.payload, ensure_ascii=False)),
            ("created", _when(job.created_at)),
            ("run at", _when(job.run_at)),
            ("expires", _when(job.expires_at) if job.expires_at else None),
            ("attempts", f"{job.attempts} of {job.max_attempts}"),
            ("running", running),
            ("finished" if job.status is not JobStatus.DEAD else "failed", finished),
            ("result", None if job.result is None else json.dumps(job.result)),
            ("error type", job.error_type),
            ("redriven", _redrives(job.redrive_count, job.redriven_at)),
            ("replay of", job.replay_of),
            ("replays", ", ".join(map(str, job.replays)) or None),
            ("idempotency", job.idempotency_key),
        ]
    )
    _print_block("last error", job.last_error)
    _print_block("traceback", job.traceback)


@cli.command("replay")
def replay_command(job_id: JobIdArgument, dsn: DsnOption = None) -> None:
    """Enqueue a finished or dead job again as a new job (replay_of = ID); prints the new id."""
    typer.echo(admin.replay(_dsn(dsn), job_id))


@cli.command("cancel")
def cancel_command(
    job_id: JobIdArgument,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Cancel even a running job: its handler runs on, its outcome is discarded.",
        ),
    ] = False,
    dsn: DsnOption = None,
) -> None:
    """Archive a queued job as cancelled, unrun (a running one only with --force)."""
    job = admin.cancel(_dsn(dsn), job_id, force=force)
    if job.worker:
        typer.echo(
            f"job {job.id} cancelled while running on worker {job.worker}: "
            "its handler may still finish, but its outcome will be discarded"
        )
    else:
        typer.echo(f"job {job.id} cancelled")


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
