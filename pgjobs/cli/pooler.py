"""`--pooler` and `--listen-dsn`, the options of the commands that may run behind a
transaction-mode pooler (`pgjobs work`, `pgjobs serve`)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from pgjobs.app import App
from pgjobs.db.dsn import Dsn, resolve_dsn
from pgjobs.db.pooler import POOLER_ENV, Pooler, parse_pooler
from pgjobs.pools import LISTEN_DSN_ENV

PoolerOption = Annotated[
    str | None,
    typer.Option(
        "--pooler",
        metavar="session|transaction",
        help="What sits between pgjobs and PostgreSQL: transaction behind a transaction-mode "
        "pooler (PgBouncer's pool_mode = transaction): no prepared statements, session settings, "
        "LISTEN or session locks. Default: $PGJOBS_POOLER, else session.",
        show_default=False,
    ),
]
ListenDsnOption = Annotated[
    str | None,
    typer.Option(
        "--listen-dsn",
        help="A direct PostgreSQL URL to LISTEN for new jobs on when the DSN goes through a "
        "transaction-mode pooler (else the worker polls). Default: $PGJOBS_LISTEN_DSN.",
        show_default=False,
    ),
]


def apply(pooler: str | None, listen_dsn: str | None) -> tuple[Pooler | None, Dsn | None]:
    """Check ``--pooler`` and ``--listen-dsn`` (``ConfigurationError``), and set them as
    ``$PGJOBS_POOLER`` and ``$PGJOBS_LISTEN_DSN`` for this process and the worker processes it
    starts (a DSN in the environment, never on a command line). Returns them, parsed."""
    mode = parse_pooler(pooler, "--pooler") if pooler is not None else None
    listen = resolve_dsn(listen_dsn, source="--listen-dsn") if listen_dsn else None
    if mode is not None:
        os.environ[POOLER_ENV] = mode.value
    if listen_dsn:
        os.environ[LISTEN_DSN_ENV] = listen_dsn
    return mode, listen


def bind(app: App, dsn: Dsn | None, mode: Pooler | None, listen: Dsn | None) -> None:
    """Bind ``app`` to ``dsn`` (else its own database) when any of the three was given: the
    command line wins over the app's own ``App(pooler=..., listen_dsn=...)``."""
    if dsn is not None or mode is not None or listen is not None:
        app.bind(dsn or app.dsn, pooler=mode, listen_dsn=listen)
