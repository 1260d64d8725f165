"""`pgjobs serve`: the HTTP API (``pgjobs.web``) on uvicorn.

The web framework is imported inside the command only, so that every other command, and above
all `pgjobs work`, never loads it.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import signal
import sys
from typing import Annotated

import typer

from pgjobs.cli import pooler as cli_pooler
from pgjobs.cli.options import DsnOption, app_option, database, find_app, use_database
from pgjobs.cli.pooler import PoolerOption
from pgjobs.db.dsn import normalize_dsn
from pgjobs.errors import ConfigurationError

#: What `pgjobs serve` needs beyond pgjobs itself: the ``web`` extra.
_WEB_MODULES = ("fastapi", "uvicorn")
_LEVELS = ("debug", "info", "warning", "error")


def serve_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=0, max=65535)] = 8080,
    app_ref: Annotated[
        str | None, app_option("holding your tasks: only their names may then be enqueued")
    ] = None,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve without tokens (local use only). Otherwise set $PGJOBS_API_TOKENS "
            "or $PGJOBS_API_TOKENS_FILE.",
        ),
    ] = False,
    max_body_bytes: Annotated[
        int, typer.Option(help="Largest request body accepted, in bytes (413 above).", min=1)
    ] = 1_048_576,
    pool_size: Annotated[
        int, typer.Option(help="Database connections the server holds at most.", min=1, max=1000)
    ] = 10,
    header_timeout: Annotated[
        float,
        typer.Option(help="Seconds a connection has to send a request's headers.", min=0.1),
    ] = 10.0,
    body_timeout: Annotated[
        float,
        typer.Option(help="Seconds a request's body may take to arrive (408 after).", min=0.1),
    ] = 30.0,
    max_connections: Annotated[
        int,
        typer.Option(
            help="Connections open at once at most; beyond it, the one that waited longest for "
            "its headers is closed.",
            min=1,
        ),
    ] = 1000,
    root_path: Annotated[
        str,
        typer.Option(
            help="Path prefix a reverse proxy serves pgjobs under (e.g. /pgjobs), for the links "
            "and cookies of the dashboard and the OpenAPI document.",
        ),
    ] = "",
    log_level: Annotated[
        str, typer.Option(help="debug, info, warning or error.", case_sensitive=False)
    ] = "info",
    dsn: DsnOption = None,
    read_dsn: Annotated[
        str | None,
        typer.Option(
            help="A standby (or any server) the statistics, listings, dashboard pages and "
            "/metrics read from; writes and actions go to --dsn. The pages say how far behind "
            "it is.",
        ),
    ] = None,
    pooler: PoolerOption = None,
    otel_metrics: Annotated[
        bool | None,
        typer.Option(
            "--otel-metrics/--no-otel-metrics",
            help="Export the queue gauges of /metrics (depth, oldest ready age, dead letters, "
            "groups at their limit) as OpenTelemetry gauges, through the meter provider your "
            "app (--app) or opentelemetry-instrument sets up. Needs the otel extra. Default: "
            "$PGJOBS_OTEL_METRICS, else off.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the HTTP API (/api/v1, token required), /healthz, /readyz and /metrics.

    Tokens: $PGJOBS_API_TOKENS (comma-separated) or $PGJOBS_API_TOKENS_FILE (one per line).

    Read-only tokens (GET routes only): $PGJOBS_API_READ_TOKENS or $PGJOBS_API_READ_TOKENS_FILE.
    """
    if root_path and (not root_path.startswith("/") or root_path.endswith("/")):
        raise ConfigurationError(
            f"--root-path {root_path!r}: give a path such as /pgjobs (a leading slash, no "
            "trailing one)"
        )
    for name, seconds in (("--header-timeout", header_timeout), ("--body-timeout", body_timeout)):
        if not math.isfinite(seconds):
            raise ConfigurationError(f"{name} {seconds}: give a number of seconds, such as 10")
    level = log_level.lower()
    if level not in _LEVELS:
        raise ConfigurationError(f"--log-level {log_level!r}: use debug, info, warning or error")
    missing = [name for name in _WEB_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigurationError(
            f"pgjobs serve needs the web extra ({', '.join(missing)} missing): "
            "pip install 'pgjobs-queue[web]'"
        )
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    from pgjobs.web import create_app
    from pgjobs.web.serving import serve

    mode, _ = cli_pooler.apply(pooler, None)
    app = find_app(app_ref)
    if app is not None:
        use_database(app, dsn)
        cli_pooler.bind(app, None, mode, None)
    web = create_app(
        app,
        dsn=database(dsn) if app is None else None,
        insecure_no_auth=insecure_no_auth,
        max_body_bytes=max_body_bytes,
        pool_size=pool_size,
        body_timeout=body_timeout,
        read_dsn=normalize_dsn(read_dsn, "--read-dsn") if read_dsn else None,
        otel_metrics=otel_metrics,
    )
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again once its own handler
    # is gone: with this one in place that ends the command normally (exit 0, as `pgjobs work`
    # does), not as a process killed by SIGTERM.
    signal.signal(signal.SIGTERM, lambda *_: None)
    # uvicorn's access log shows the method, path and status of each request, never a header;
    # each kind of line is rate-limited (pgjobs.web.serving), so a flood cannot fill the disk.
    serve(
        web,
        host=host,
        port=port,
        log_level=level,
        root_path=root_path,
        header_timeout=header_timeout,
        max_connections=max_connections,
    )
