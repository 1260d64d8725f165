"""`pgjobs work`: run a worker, or supervise several worker processes (``--processes``)."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from pgjobs import supervisor
from pgjobs.cli.options import DsnOption, database, load_app
from pgjobs.errors import ConfigurationError
from pgjobs.worker import Worker, WorkerConfig

#: The worker's defaults, shown by --help (WorkerConfig holds them).
_DEFAULTS = WorkerConfig()


def work_command(
    app_ref: Annotated[str, typer.Option("--app", help="package.module:app holding your tasks.")],
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
        expire_interval=expire_interval,
    )
    # A worker process started by --processes: the supervisor resolved the database.
    link = supervisor.SupervisorLink(supervisor_fd) if supervisor_fd is not None else None
    app = load_app(app_ref)
    if link is not None:
        app.bind(link.dsn)
    elif dsn:
        app.bind(database(dsn))
    if processes > 1:
        # Resolved once, here, as a single worker would (--dsn, else the app's own, else the
        # environment, else the embedded server, started once for all worker processes).
        command = [sys.executable, "-m", "pgjobs", *work_argv(app_ref, config, log_level)]
        raise typer.Exit(
            supervisor.Supervisor(command, app.dsn, processes, burst=config.burst).run()
        )
    raise typer.Exit(Worker(app, config).run(on_checked=link.ready if link else None))


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
    return argv
