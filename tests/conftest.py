"""Test fixtures. The suite stands on the pytest plugin pgjobs ships (``pgjobs.testing``), as a
user's suite does: its server ($PGJOBS_TEST_DSN or $DATABASE_URL, else the embedded server, else a
testcontainers container; with none of them the session stops at once with one line saying what
to set), its migrated throwaway database dropped at the end, and its tables emptied before each
test. Here: the suite's names for those, fresh unmigrated databases for the migration tests, and
connections, apps and subprocess environments on the test database.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

import pgjobs.testing
from pgjobs import App, JobSpec, enqueue
from pgjobs.db.dsn import Dsn
from pgjobs.testing import throwaway_database
from tests.support.helpers import pgjobs_env

#: Throwaway databases dropped at once at the end of a session (one connection each).
DROPPING_AT_ONCE = 8


def pytest_configure(config: pytest.Config) -> None:
    # The plugin loads by its entry point; a run with PYTEST_DISABLE_PLUGIN_AUTOLOAD (and no
    # ``-p pgjobs.testing``) gets it here.
    if not config.pluginmanager.is_registered(pgjobs.testing):
        config.pluginmanager.register(pgjobs.testing, "pgjobs")
    # A worker serves its endpoint on $PORT when set (platforms set it); the tests' workers
    # listen only where a test says.
    os.environ.pop("PORT", None)


@pytest.fixture(scope="session")
def server_url(pgjobs_server_url: str) -> str:
    """URL of the PostgreSQL server the session may create databases on (the plugin's)."""
    return pgjobs_server_url


@pytest.fixture(scope="session")
def create_database(server_url: str) -> Iterator[Callable[[], Dsn]]:
    """Factory of empty (unmigrated) throwaway databases on the test server, all dropped at
    session end, several at a time: a DROP DATABASE waits for a checkpoint, and drops waiting
    together share one (one by one, the hundred-odd databases of a run took two minutes)."""
    created: list[contextlib.ExitStack] = []

    def create() -> Dsn:
        stack = contextlib.ExitStack()
        created.append(stack)
        return stack.enter_context(throwaway_database(server_url, migrated=False))

    yield create
    with ThreadPoolExecutor(max_workers=DROPPING_AT_ONCE) as pool:
        list(pool.map(contextlib.ExitStack.close, created))


@pytest.fixture(scope="session")
def database(pgjobs_session_database: Dsn) -> Dsn:
    """The session's migrated database (the plugin's; tables not emptied: see ``dsn``)."""
    return pgjobs_session_database


@pytest.fixture
def dsn(pgjobs_database: Dsn) -> Dsn:
    """The migrated database, with every pgjobs table empty (the plugin's ``pgjobs_database``)."""
    return pgjobs_database


@pytest.fixture
def conn(dsn: Dsn) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test database."""
    with psycopg.connect(dsn.url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def refusing(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A constraint of the application's refusing a payload with the key ``refused``: what only
    the database refuses."""
    conn.execute(
        "ALTER TABLE queued_jobs ADD CONSTRAINT test_no_refused CHECK (NOT payload ? 'refused')"
    )
    try:
        yield
    finally:
        conn.execute("ALTER TABLE queued_jobs DROP CONSTRAINT test_no_refused")


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


@pytest.fixture
def specs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[JobSpec]]:
    """The JobSpecs a surface (the CLI, the HTTP API) hands to the producer, which then
    enqueues them as usual."""
    seen: list[JobSpec] = []
    prepare = enqueue.prepare

    def spy(spec: JobSpec, tasks: Any, **options: Any) -> enqueue.PreparedJob:
        seen.append(spec)
        return prepare(spec, tasks, **options)

    monkeypatch.setattr(enqueue, "prepare", spy)
    # prepare_many calls the module's own prepare: a batch's specs are seen there.
    monkeypatch.setattr(enqueue.rows, "prepare", spy)
    yield seen
