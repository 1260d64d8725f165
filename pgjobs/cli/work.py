"""`pgjobs work`: run a worker, or supervise several worker processes (``--processes``)."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from pgjobs import instruments, supervisor
from pgjobs.cli import parse
from pgjobs.cli import pooler as cli_pooler
from pgjobs.cli.options import (
    NAME_THE_APP,
    DsnOption,
    app_option,
    app_reference,
    load_app,
    use_database,
)
from pgjobs.cli.pooler import ListenDsnOption, PoolerOption
from pgjobs.db.project import find_project
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.retention_policy import RetentionPolicy
from pgjobs.submission import check_seconds
from pgjobs.targets import ExternalTarget, check_headers, check_url
from pgjobs.worker import Worker, WorkerConfig
from pgjobs.worker.config import MAX_READ_AHEAD, READ_AHEAD_PER_SLOT, check_http_token
from pgjobs.worker.http import DEFAULT_HOST, address_text, parse_address

#: The environment variable whose port the worker serves its endpoint on when --http is not given.
PORT_ENV = "PORT"
#: The environment variable that holds the token of the endpoint's /metrics and /stats.
HTTP_TOKEN_ENV = "PGJOBS_WORKER_HTTP_TOKEN"
#: The worker's defaults, shown by --help (WorkerConfig holds them).
_DEFAULTS = WorkerConfig()


def work_command(
    app_ref: Annotated[str | None, app_option("holding your tasks")] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", help="Jobs run at once.", min=1, max=10_000)
    ] = _DEFAULTS.concurrency,
    queues: Annotated[
        list[str] | None,
        typer.Option(
            "--queue", "-q", help="Queue to work (repeatable). Default: the tasks' queues."
        ),
    ] = None,
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between polls when no NOTIFY arrives.", min=0.01)
    ] = _DEFAULTS.poll_interval,
    grace: Annotated[
        float, typer.Option(help="Seconds running jobs get to finish after SIGTERM.", min=0)
    ] = _DEFAULTS.grace,
    burst: Annotated[
        bool, typer.Option("--burst", help="Exit once the queues hold no job.")
    ] = False,
    read_ahead: Annotated[
        int | None,
        typer.Option(
            "--read-ahead",
            help="Jobs claimed ahead of free slots while the queues hold a backlog, at most "
            "what the handlers start within 50 ms at their recent pace; 0: none. Default: "
            f"{READ_AHEAD_PER_SLOT} per slot.",
            min=0,
            max=MAX_READ_AHEAD,
            show_default=False,
        ),
    ] = None,
    maintenance: Annotated[
        bool, typer.Option(help="Run the lease rescuer and expirer in this worker.")
    ] = _DEFAULTS.maintenance,
    rescue_interval: Annotated[
        float,
        typer.Option(help="Seconds between lease-rescuer rounds (expired leases freed).", min=0.1),
    ] = _DEFAULTS.rescue_interval,
    expire_interval: Annotated[
        float,
        typer.Option(
            help="Seconds between expirer rounds (jobs past their expires_at archived).", min=0.1
        ),
    ] = _DEFAULTS.expire_interval,
    retain_archive: Annotated[
        str | None,
        typer.Option(
            "--retain-archive",
            metavar="AGE",
            help="Remove archived jobs that finished longer ago than this (30d, 12h, 2w...): "
            "whole daily partitions, by the retention service the workers run one at a time. "
            "Default: [tool.pgjobs.retention] archive, else App(retention=...), else kept.",
            show_default=False,
        ),
    ] = None,
    retain_dead: Annotated[
        str | None,
        typer.Option(
            "--retain-dead",
            metavar="AGE",
            help="Remove dead letters that failed longer ago than this (in batches). Default: "
            "[tool.pgjobs.retention] dead_letter, else App(retention=...), else kept.",
            show_default=False,
        ),
    ] = None,
    retain_export: Annotated[
        Path | None,
        typer.Option(
            "--retain-export",
            metavar="FOLDER",
            help="Copy what retention removes into this folder first (a CSV file per "
            "partition, and per table for rows deleted in batches).",
            show_default=False,
        ),
    ] = None,
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
            max=supervisor.MAX_PROCESSES,
        ),
    ] = 1,
    http: Annotated[
        str | None,
        typer.Option(
            "--http",
            metavar="[HOST:]PORT",
            help="Serve /metrics, /healthz, /readyz and /stats on HOST:PORT (e.g. 0.0.0.0:9090 "
            "for other machines; port 0: any free port); a PORT alone listens on 127.0.0.1 only. "
            "Default: 127.0.0.1:$PORT when $PORT is set, else none. With --processes N, worker "
            "process i listens on PORT+i.",
            show_default=False,
        ),
    ] = None,
    http_token: Annotated[
        str | None,
        typer.Option(
            "--http-token",
            metavar="TOKEN",
            help="The token /metrics and /stats ask for (Authorization: Bearer TOKEN), at least "
            "16 characters; /healthz and /readyz never ask. Prefer "
            f"${HTTP_TOKEN_ENV} (a command line shows in ps). Default: ${HTTP_TOKEN_ENV}, "
            "else none.",
            show_default=False,
        ),
    ] = None,
    external_url: Annotated[
        str | None,
        typer.Option(
            "--external-url",
            help="URL that external tasks declared without one are delivered to.",
            show_default=False,
        ),
    ] = None,
    external_timeout: Annotated[
        float | None,
        typer.Option(
            "--external-timeout",
            help="Seconds a delivery to an external task's downstream may take, for tasks that "
            "set no timeout. Default: 10.",
            show_default=False,
        ),
    ] = None,
    external_headers: Annotated[
        list[str] | None,
        typer.Option(
            "--external-header",
            metavar="'NAME: VALUE'",
            help="Header sent with every delivery to a downstream (repeatable); a task's own "
            "headers win. For a bearer token, prefer $PGJOBS_EXTERNAL_TOKEN (a command line "
            "shows in ps).",
            show_default=False,
        ),
    ] = None,
    otel_metrics: Annotated[
        bool | None,
        typer.Option(
            "--otel-metrics/--no-otel-metrics",
            help="Record the jobs' outcomes, run time and pickup latency as OpenTelemetry "
            "metrics, through the meter provider your app or opentelemetry-instrument sets up. "
            "Needs the otel extra. Default: $PGJOBS_OTEL_METRICS, else off.",
            show_default=False,
        ),
    ] = None,
    supervisor_fd: Annotated[
        int | None, typer.Option("--supervisor-fd", hidden=True, help="Set by --processes.")
    ] = None,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    listen_dsn: ListenDsnOption = None,
) -> None:
    """Run workers: claim jobs, run their handlers, record the outcomes."""
    mode, listen = cli_pooler.apply(pooler, listen_dsn)
    level = logging.getLevelNamesMapping().get(log_level.upper())
    if level is None:
        raise ConfigurationError(f"--log-level {log_level!r}: use debug, info, warning or error")
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    address = _http_address(http, processes) if http is not None else _port_address(processes)
    config = WorkerConfig(
        concurrency=concurrency,
        queues=queues or None,
        poll_interval=poll_interval,
        grace=grace,
        burst=burst,
        maintenance=maintenance,
        rescue_interval=rescue_interval,
        expire_interval=expire_interval,
        http=address,
        http_token=_http_token(http_token, address),
        external=_external(external_url, external_timeout, external_headers),
        read_ahead=read_ahead,
        retention=_retention(retain_archive, retain_dead, retain_export),
        otel_metrics=instruments.enabled_from_env() if otel_metrics is None else otel_metrics,
    )
    # A worker process of --processes gets the database from its supervisor: started as a fresh
    # interpreter (--supervisor-fd), or forked here, before the app is imported.
    link = supervisor.SupervisorLink(supervisor_fd) if supervisor_fd is not None else None
    forked: list[supervisor.Forked] = []
    if processes > 1 and link is None:
        if config.http_token is not None:
            # Worker processes started afresh read it there: a secret never goes on a command line.
            os.environ[HTTP_TOKEN_ENV] = config.http_token
        link, forked = supervisor.fork_workers(processes)
    if link is not None:
        config = replace(config, http=_slot_address(config.http, link.slot))
    try:
        reference = app_reference(app_ref)
        if reference is None:
            raise ConfigurationError(f"pgjobs work needs your app: {NAME_THE_APP}")
        app = load_app(reference.text, reference.source)
        if link is not None:
            app.bind(link.dsn)
        else:
            use_database(app, dsn)
        cli_pooler.bind(app, None, mode, listen)
        if link is None and processes > 1:
            # Resolved once, here, as a single worker would (--dsn, else the app's own, else the
            # environment, else the embedded server, started once for all worker processes).
            # The worker processes get the app as found here, by --app.
            argv = work_argv(reference.text, config, log_level)
            command = [sys.executable, "-m", "pgjobs", *argv]
            code = supervisor.Supervisor(
                command, app.dsn, processes, burst=config.burst, forked=forked
            ).run()
        else:
            code = Worker(app, config).run(
                on_checked=link.ready if link else None, exit_process=True
            )
    except BaseException as exc:
        # Worker processes forked for a supervisor that failed before it could look after
        # them: they wait for the database, which they will not get (a supervisor that ran
        # reaped them already).
        supervisor.abandon(forked)
        if not isinstance(exc, PgjobsError):
            raise
        # A worker process of --processes that is not ready yet tells the supervisor, which
        # prints the error of N failed starts once, instead of printing it here.
        exit_with = 2 if isinstance(exc, ConfigurationError) else 1
        if link is None or not link.failed(exc, exit_with):
            raise
        code = exit_with
    if (link is None and processes > 1) or (link is not None and link.forked):
        supervisor.leave(code)
    # When the process exits, its last garbage collections would walk every object the imports
    # and the run left (~80 ms, most of a burst's time after its last job): freezing them at
    # exit leaves that walk out. Other atexit handlers and module teardown still run.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    raise typer.Exit(code)


def work_argv(app_ref: str, config: WorkerConfig, log_level: str) -> list[str]:
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
        f"--expire-interval={config.expire_interval!r}",
        f"--log-level={log_level}",
        "--maintenance" if config.maintenance else "--no-maintenance",
    ]
    argv += [f"--queue={queue}" for queue in config.queues or ()]
    if config.burst:
        argv.append("--burst")
    policy = config.retention
    if policy is not None:
        for option, period in (("archive", policy.archive), ("dead", policy.dead_letter)):
            if period is not None:
                seconds = f"{period.total_seconds():.6f}".rstrip("0").rstrip(".")
                argv.append(f"--retain-{option}={seconds}s")
        if policy.export is not None:
            argv.append(f"--retain-export={policy.export}")
    # Always said: a worker process must not read $PGJOBS_OTEL_METRICS against the command line.
    argv.append("--otel-metrics" if config.otel_metrics is not False else "--no-otel-metrics")
    if config.read_ahead is not None:
        argv.append(f"--read-ahead={config.read_ahead}")
    if config.http is not None:
        # Every worker process gets the base address; process i adds i to the port.
        argv.append(f"--http={address_text(*config.http)}")
    target = config.external
    if target.url is not None:
        argv.append(f"--external-url={target.url}")
    if target.timeout is not None:
        argv.append(f"--external-timeout={target.timeout!r}")
    argv += [f"--external-header={name}: {value}" for name, value in target.headers]
    return argv


def _retention(
    archive: str | None, dead: str | None, export: Path | None
) -> RetentionPolicy | None:
    """The retention policy of ``[tool.pgjobs.retention]`` with what --retain-archive,
    --retain-dead and --retain-export say in place of its own; None when neither gives one."""
    project = find_project()
    base = project.retention if project is not None else None
    if archive is None and dead is None and export is None:
        return base
    if export is not None and not export.is_dir():
        raise ConfigurationError(f"--retain-export {export}: not a folder")
    flags = RetentionPolicy(
        archive=parse.age("--retain-archive", archive) if archive is not None else None,
        dead_letter=parse.age("--retain-dead", dead) if dead is not None else None,
        export=export,
    )
    return base.merged(flags) if base is not None else flags


def _http_address(text: str, processes: int, source: str = "--http") -> tuple[str, int]:
    """--http's (host, port), checked for the ports of --processes N."""
    host, port = parse_address(text)
    if port and port + processes - 1 > 65535:
        raise ConfigurationError(
            f"{source} {text}: with --processes {processes} the ports "
            f"{port}..{port + processes - 1} are needed; choose a lower port"
        )
    return host, port


def _port_address(processes: int) -> tuple[str, int] | None:
    """Without --http: 127.0.0.1:$PORT when $PORT is set (a port alone, as ``--http PORT``: for
    this machine only; a platform that probes from elsewhere is given --http 0.0.0.0:$PORT),
    else no endpoint. An empty $PORT is unset."""
    value = os.environ.get(PORT_ENV, "").strip()
    if not value:
        return None
    if not value.isascii() or not value.isdigit() or int(value) > 65535:
        raise ConfigurationError(
            f"${PORT_ENV} {value[:40]!r}: expected a port number 0..65535 (or give --http HOST:PORT)"
        )
    return _http_address(f"{DEFAULT_HOST}:{int(value)}", processes, f"${PORT_ENV}")


def _http_token(given: str | None, address: tuple[str, int] | None) -> str | None:
    """--http-token, else $PGJOBS_WORKER_HTTP_TOKEN (spaces around it dropped: a secret read
    from a file ends in a newline), checked; None when there is no endpoint to protect. An empty
    variable is unset. Nothing of the token is ever shown."""
    if given is not None:
        if address is None:
            raise ConfigurationError(
                "--http-token protects the worker's endpoint: give --http [HOST:]PORT too"
            )
        return check_http_token(given.strip(), "--http-token")
    value = os.environ.get(HTTP_TOKEN_ENV, "").strip()
    if not value or address is None:
        return None
    return check_http_token(value, f"${HTTP_TOKEN_ENV}")


def _slot_address(address: tuple[str, int] | None, slot: int) -> tuple[str, int] | None:
    """Worker process ``slot`` of --processes listens on port + slot (port 0 stays 0)."""
    if address is None or not address[1]:
        return address
    return address[0], address[1] + slot


def _external(url: str | None, timeout: float | None, headers: list[str] | None) -> ExternalTarget:
    """The worker's defaults for external tasks, each value checked under its option's name."""
    if url is not None:
        check_url("--external-url", url)
    if timeout is not None:
        check_seconds("--external-timeout", timeout, positive=True)
    pairs = check_headers("--external-header", [_header(text) for text in headers or ()])
    return ExternalTarget(url=url, timeout=timeout, headers=pairs)


def _header(text: str) -> tuple[str, str]:
    """``--external-header 'Name: value'`` as (name, value). Nothing of the text is shown in
    an error: it may hold a secret."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ConfigurationError(
            "--external-header: expected 'Name: value' (a header name, a colon, the value)"
        )
    return name.strip(), value.strip()
