"""The `pgjobs` command: the only place that wires everything together.

One module per command group (``migrate``, ``enqueue``, ``work``, ``stats``, ``prune``, ``dead``,
``job``), each imported only when its command runs (``commands`` lists them); ``parse`` holds
the one grammar of ages and times, ``render`` how everything prints, ``options`` what the
commands share, ``completion`` the shell completion and the help's look.
``main`` runs the command and turns every error into one line on stderr and an exit code.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Annotated

import typer

from pgjobs.cli import completion
from pgjobs.cli.commands import LazyGroup
from pgjobs.cli.messages import error
from pgjobs.errors import ConfigurationError, PgjobsError

cli = typer.Typer(
    name="pgjobs",
    help="A durable background-job queue backed by PostgreSQL alone.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=LazyGroup,  # each command's module imported only when it runs (pgjobs.cli.commands)
)
DEBUG_ENV = "PGJOBS_DEBUG"
#: Whether this run's ``--debug`` was given (set by the callback, reset by ``main``).
_debug = [False]


#: The name pgjobs is installed by (``pip install pgjobs-queue``); the import package and the
#: command are ``pgjobs``.
DISTRIBUTION = "pgjobs-queue"


def _print_version(wanted: bool) -> None:
    """``--version``: the installed version, from the package's metadata (no database)."""
    if not wanted:
        return
    # Imported here: about 20 ms of `pgjobs --help` and of every command that never connects
    # (psycopg imports it for its own version).
    import importlib.metadata

    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigurationError(
            f"pgjobs is not installed as {DISTRIBUTION} (run from a source tree?): no version "
            f"to show; pip install -e . installs it"
        ) from None
    typer.echo(f"pgjobs {version}")
    raise typer.Exit(0)


@cli.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", help=f"Show the traceback of an unexpected error (or set ${DEBUG_ENV}=1)."
        ),
    ] = False,
) -> None:
    """A durable background-job queue backed by PostgreSQL alone."""
    _debug[0] = debug


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; every error is one line on stderr.

    Example: ``main(["migrate", "--check"])`` returns 1 while the database is behind.
    """
    _debug[0] = False
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        if (shell := completion.named_shell(args)) is not None:
            completion.complete_for(*shell)
            return 0
        result = completion.command(cli).main(args=args, prog_name="pgjobs", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:  # shell completion (--show-completion, $_PGJOBS_COMPLETE) exits
        return exc.code if isinstance(exc.code, int) else 0
    except typer.TyperException as exc:  # usage errors: bad option values, unknown commands
        error(exc.format_message())
        return exc.exit_code
    except typer.Abort:
        error("aborted")
        return 130
    except ConfigurationError as exc:
        error(str(exc))
        return 2
    except PgjobsError as exc:
        error(str(exc))
        return 1
    except Exception as exc:  # a bug, or a library's error no command expected: one line
        return _unexpected(exc)
    return result if isinstance(result, int) else 0


def _unexpected(exc: Exception) -> int:
    """Report an exception no command turned into a ``PgjobsError``: one line on stderr and exit
    1; the traceback first with ``--debug`` or ``PGJOBS_DEBUG=1``."""
    debug = _debug[0] or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "no")
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    try:
        text = str(exc)
    except Exception:
        text = "<message could not be read>"
    hint = "" if debug else f" (run with --debug or {DEBUG_ENV}=1 for the traceback)"
    from pgjobs.db.dsn import scrub  # imports the driver: only on this rare path

    error(f"unexpected error: {type(exc).__name__}: {scrub(text)}{hint}")
    return 1


def run() -> None:
    """Console-script entry point (``pgjobs = "pgjobs.cli:run"``)."""
    # A command's imports make objects that live until the process exits, and next to no cyclic
    # garbage; yet the collector walks them again and again while they import, and once more at
    # exit: a third of `pgjobs enqueue`'s time beyond a bare `import psycopg`. So it is off until
    # the command's module has loaded, and what exists then is frozen (never walked again, at
    # exit neither). Only here, in a process of its own: ``main`` runs inside tests too.
    gc.disable()
    LazyGroup.loaded = staticmethod(_imports_done)
    atexit.register(gc.freeze)
    sys.exit(main())


def _imports_done() -> None:
    gc.freeze()
    gc.enable()
