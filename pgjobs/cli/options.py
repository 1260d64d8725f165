"""What several commands share: the database option, ``--json``, a job id, and finding and
loading the user's app (``--app``, ``$PGJOBS_APP``, ``[tool.pgjobs]`` in ``pyproject.toml``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from pgjobs.app import App
from pgjobs.db.dsn import Dsn, resolve_dsn
from pgjobs.db.project import check_trusted, find_project, nearest_pyproject
from pgjobs.errors import ConfigurationError
from pgjobs.submission import MAX_JOB_ID

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        # Help texts are rich markup: "[embedded]" would be read as a style and vanish unless
        # escaped with a backslash.
        help="PostgreSQL URL. Default: $PGJOBS_DATABASE_URL, then the variable "
        "\\[tool.pgjobs] dsn names in pyproject.toml, then $DATABASE_URL, then the "
        "embedded server (pgjobs-queue\\[embedded]).",
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


APP_ENV = "PGJOBS_APP"
#: The three ways to name the app, for the message of a command that needs one.
NAME_THE_APP = (
    f'give --app package.module:app, set ${APP_ENV}, or add app = "package.module:app" under '
    "[tool.pgjobs] in pyproject.toml"
)


def app_option(what: str, *, found: bool = True) -> Any:
    """The ``--app`` option (typer's ``OptionInfo``); ``what`` says what the command does with
    the app. ``found=False``: a command that imports an app only when given ``--app``."""
    default = (
        f"Default: ${APP_ENV}, then \\[tool.pgjobs] app in the nearest pyproject.toml."
        if found
        else f"Only when given: ${APP_ENV} and \\[tool.pgjobs] app are not read."
    )
    return typer.Option("--app", help=f"package.module:app {what}. {default}", show_default=False)


@dataclass(frozen=True, slots=True)
class AppReference:
    """``package.module:attribute`` naming the app, and where it was given (for messages)."""

    text: str
    source: str


def app_reference(explicit: str | None) -> AppReference | None:
    """The app a command uses: ``--app``, else ``$PGJOBS_APP``, else ``app`` under
    ``[tool.pgjobs]`` in the nearest ``pyproject.toml``; None when none names one.

    Example: ``app_reference(None).text == "shop.jobs:app"`` with ``PGJOBS_APP=shop.jobs:app``
    """
    if explicit is not None:
        return AppReference(explicit, "--app")
    named = os.environ.get(APP_ENV, "").strip()
    if named:
        return AppReference(named, f"${APP_ENV}")
    project = find_project()
    if project is not None and project.app is not None:
        return AppReference(project.app, project.where("app"))
    return None


def find_app(explicit: str | None) -> App | None:
    """The app ``app_reference`` finds, loaded (not bound to a database yet: see
    ``use_database``); None when none is named."""
    reference = app_reference(explicit)
    return None if reference is None else load_app(reference.text, reference.source)


def database(raw: str | None) -> Dsn:
    """The database a command works on: ``--dsn``, else ``$PGJOBS_DATABASE_URL``, else the
    variable that ``dsn = "env:NAME"`` under ``[tool.pgjobs]`` names, else ``$DATABASE_URL``,
    else the embedded server: the order ``App()`` follows too (``resolve_dsn``)."""
    return resolve_dsn(raw)


def use_database(app: App, raw: str | None) -> None:
    """Bind ``app`` to the command's database: ``--dsn`` first, then the app's own
    (``App(dsn=...)``), then the rest of ``database``'s order."""
    if raw or app.settled_dsn is None:
        app.bind(database(raw))


def load_app(reference: str, source: str = "--app") -> App:
    """The ``pgjobs.App`` that ``package.module:attribute`` names (attribute: ``app``), given
    as ``source``. The module is imported from the working directory or from the directory of
    the nearest ``pyproject.toml`` (the project's root). Neither that file nor the module (nor
    a package above it) is imported when someone else may have written it: ``check_trusted``."""
    where = f"{source} {reference!r}"
    module_name, _, attribute = reference.partition(":")
    if not module_name:
        raise ConfigurationError(f"{where}: expected package.module:app")
    pyproject = nearest_pyproject()
    if pyproject is not None:
        check_trusted(pyproject)
    for root in (*([pyproject.parent] if pyproject else []), Path(os.getcwd())):
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    _check_module_files(module_name, where)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"{where}: cannot import {module_name}: {exc}") from None
    except Exception as exc:  # the module itself failed: a syntax error, or its code raised
        raise ConfigurationError(
            f"{where}: importing {module_name} failed: {_where_it_failed(exc)}"
        ) from None
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, App):
        raise ConfigurationError(
            f"{where}: {module_name} has no pgjobs.App named {attribute or 'app'!r}"
        )
    return app


def _check_module_files(module_name: str, where: str) -> None:
    """Refuse, before anything runs, the app's module when its file, or that of a package above
    it that importing it would run, may have been written by someone else (``check_trusted``).
    The files are found as the import will find them, without running any; a module pgjobs
    cannot find is left to the import's own message."""
    search: Any = None  # top level: sys.path
    parts = module_name.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        spec = loaded.__spec__ if loaded is not None else _find_spec(name, search)
        if spec is None:
            return
        origin = _origin_file(spec) if loaded is None else None
        if origin is not None:
            check_trusted(origin, f"{origin} (module {name} of {where})")
        search = spec.submodule_search_locations
        if search is None:
            return


def _origin_file(spec: Any) -> Path | None:
    """The file a module's code comes from: its source (or compiled) file, or the zip archive
    that holds it; None for a built-in or a namespace package."""
    if not spec.has_location or not spec.origin:
        return None
    for candidate in (spec.origin, getattr(spec.loader, "archive", None)):
        if candidate and os.path.isfile(candidate):
            return Path(candidate)
    return None


def _find_spec(name: str, search: Any) -> Any:
    """The spec the import system would find for ``name`` (the finders of ``sys.meta_path``,
    given the parent package's folders), without importing anything; None when none does."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, search)
        except (ImportError, ValueError):
            return None
        if spec is not None:
            return spec
    return None


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
