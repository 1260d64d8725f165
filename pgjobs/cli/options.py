"""What several commands share: the database option, ``--json``, a job id, and loading the
user's app."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Annotated

import typer
from rich.markup import escape

from pgjobs.app import App
from pgjobs.db.dsn import Dsn, resolve_dsn
from pgjobs.errors import ConfigurationError
from pgjobs.submission import MAX_JOB_ID

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        # Help texts are rich markup: "[embedded]" would be read as a style and vanish.
        help="PostgreSQL URL. Default: $PGJOBS_DATABASE_URL, then $DATABASE_URL, "
        f"then the embedded server ({escape('pgjobs[embedded]')}).",
        show_default=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]


def job_ids(value: int | list[int] | None) -> int | list[int] | None:
    """A job id argument (or several): each within 1..MAX_JOB_ID, else bad input (an id beyond
    bigint would reach PostgreSQL, which refuses it as a data exception)."""
    for job_id in value if isinstance(value, list) else [value]:
        if job_id is not None and not 1 <= job_id <= MAX_JOB_ID:
            raise typer.BadParameter(f"{job_id} is out of range: job ids are 1..{MAX_JOB_ID}")
    return value


JobIdArgument = Annotated[
    int, typer.Argument(help="The job id.", show_default=False, callback=job_ids)
]


def database(raw: str | None) -> Dsn:
    """The database a command works on: ``--dsn``, else the environment, else the embedded
    server."""
    return resolve_dsn(raw)


def load_app(reference: str) -> App:
    """The ``pgjobs.App`` that ``--app package.module:attribute`` names (attribute: ``app``)."""
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
    except Exception as exc:  # the module itself failed: a syntax error, or its code raised
        raise ConfigurationError(
            f"--app {reference!r}: importing {module_name} failed: {_where_it_failed(exc)}"
        ) from None
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, App):
        raise ConfigurationError(
            f"--app {reference!r}: {module_name} has no pgjobs.App named {attribute or 'app'!r}"
        )
    return app


def _where_it_failed(exc: Exception) -> str:
    """``exc`` in one line and where it happened: ``SyntaxError: invalid syntax (app.py:3)``, or
    the innermost frame of the traceback, ``ValueError: boom (app.py:12)``."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}"
        return f"{type(exc).__name__}: {exc.msg} ({where})"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {_text(exc)}{where}"


def _text(exc: BaseException) -> str:
    """``str(exc)``, even when it raises."""
    try:
        return str(exc)
    except Exception:
        return "<message could not be read>"
