"""``App.open()`` opens the pool ahead of the first enqueue and fails fast; ``App`` takes libpq
``key=value`` DSNs as psycopg does, and names ``App(dsn=...)`` in errors about them."""

from __future__ import annotations

import asyncio

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgjobs import App, ConfigurationError, DatabaseUnavailable
from tests.support.helpers import count

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x?connect_timeout=2"


def _key_value(url: str) -> str:
    """The test database's URL as a libpq key=value string."""
    return make_conninfo("", **conninfo_to_dict(url))


def test_open_connects_before_the_first_enqueue(dsn, conn):
    app = App(dsn.url)
    assert app._pools.pool is None
    with app.open() as opened:
        assert opened is app
        assert app._pools.pool is not None, "the pool is open before any enqueue"
        pool = app._pools.pool
        app.open()  # opening an open app does nothing
        assert app._pools.pool is pool
        app.enqueue("anything", {})
    assert app._pools.pool is None, "the block closes the pool"
    assert count(conn, "queued_jobs") == 1


def test_open_fails_fast_when_the_database_cannot_be_reached():
    app = App(UNREACHABLE)
    with pytest.raises(DatabaseUnavailable, match=r"cannot reach the database .*App\(dsn=\.\.\.\)"):
        app.open()
    assert app._pools.pool is None


def test_open_async_opens_the_loops_pool(dsn, conn):
    async def scenario() -> list[int]:
        async with await App(dsn.url).open_async() as app:
            assert app._pools.async_pool is not None
            return await app.enqueue_many_async([])

    assert asyncio.run(scenario()) == []

    async def unreachable() -> None:
        await App(UNREACHABLE).open_async()

    with pytest.raises(DatabaseUnavailable):
        asyncio.run(unreachable())


def test_an_app_takes_a_libpq_key_value_dsn(dsn, conn):
    conninfo = _key_value(dsn.url)
    assert "://" not in conninfo
    with App(conninfo) as app:
        job_id = app.enqueue("anything", {"n": 1})
        assert app.dsn.source == "App(dsn=...)"
        assert conninfo_to_dict(app.dsn.url) == conninfo_to_dict(conninfo)
    assert conn.execute("SELECT id FROM queued_jobs").fetchall() == [(job_id,)]


@pytest.mark.parametrize(
    "raw", ["mysql://root@h/db", "host=h password='unterminated", "host=h port=abc", "nonsense"]
)
def test_a_bad_dsn_is_refused_when_the_app_is_built_naming_app_dsn(raw):
    with pytest.raises(ConfigurationError) as refused:
        App(raw)
    message = str(refused.value)
    assert message.startswith("App(dsn=...)"), message
    assert "--dsn" not in message
    assert "unterminated" not in message


def test_an_unreachable_key_value_dsn_names_app_dsn_and_hides_the_password():
    app = App("host=127.0.0.1 port=1 dbname=x user=u password=hunter22 connect_timeout=2")
    with pytest.raises(DatabaseUnavailable) as refused:
        app.enqueue("anything", {})
    assert "App(dsn=...)" in str(refused.value)
    assert "hunter22" not in str(refused.value)


def test_bind_takes_a_dsn_string_and_checks_it(dsn, conn):
    app = App()
    with pytest.raises(ConfigurationError, match=r"^App\(dsn=\.\.\.\)"):
        app.bind("mysql://root@h/db")
    app.bind(_key_value(dsn.url))
    with app:
        job_id = app.enqueue("anything", {})
    assert conn.execute("SELECT id FROM queued_jobs").fetchall() == [(job_id,)]
