"""The connections an enqueue runs on: pgjobs' own (psycopg, autocommit) or the caller's (psycopg
or SQLAlchemy, sync or async), and how a statement, a COPY or an atomic block runs on each.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import Any, NamedTuple

import psycopg

from pgjobs.errors import ConfigurationError


class Statement(NamedTuple):
    """One statement an insert needs run, and its parameters."""

    sql: str
    params: dict[str, Any]


class Copy(NamedTuple):
    """A COPY an insert needs run (on a psycopg connection only), and the rows it writes."""

    sql: str
    lines: Iterable[tuple[Any, ...]]


def own(conn: Any) -> bool:
    """Whether ``conn`` is pgjobs' own kind: a psycopg connection in autocommit mode."""
    return isinstance(conn, psycopg.Connection | psycopg.AsyncConnection) and conn.autocommit


def copies(conn: Any) -> bool:
    """Whether ``conn`` can run a ``Copy`` (a psycopg connection, sync or async)."""
    return isinstance(conn, psycopg.Connection | psycopg.AsyncConnection)


def execute(conn: Any, statement: tuple[str, dict[str, Any]] | Copy) -> list[tuple[Any, ...]]:
    """Run ``statement`` on a sync ``conn``; its rows (none for a ``Copy``)."""
    if isinstance(statement, Copy):
        with conn.cursor() as cursor, cursor.copy(statement.sql) as copy:
            for line in statement.lines:
                copy.write_row(line)
        return []
    sql, params = statement
    if isinstance(conn, psycopg.Connection):
        return conn.execute(sql, params, prepare=True).fetchall()
    exec_driver_sql = getattr(conn, "exec_driver_sql", None)
    if exec_driver_sql is None or is_async(conn):
        raise ConfigurationError(
            "connection must be a psycopg.Connection or a SQLAlchemy Connection "
            f"(use enqueue_async for an async one), got {type(conn).__name__}",
            field="connection",
        )
    return [tuple(row) for row in exec_driver_sql(sql, params).fetchall()]


async def execute_async(
    conn: Any, statement: tuple[str, dict[str, Any]] | Copy
) -> list[tuple[Any, ...]]:
    """``execute`` on an async ``conn``."""
    if isinstance(statement, Copy):
        async with conn.cursor() as copier, copier.copy(statement.sql) as copy:
            for line in statement.lines:
                await copy.write_row(line)
        return []
    sql, params = statement
    if isinstance(conn, psycopg.AsyncConnection):
        cursor = await conn.execute(sql, params, prepare=True)
        return await cursor.fetchall()
    if not is_async(conn):
        raise ConfigurationError(
            "connection must be a psycopg.AsyncConnection or a SQLAlchemy AsyncConnection "
            f"(use enqueue for a sync one), got {type(conn).__name__}",
            field="connection",
        )
    result = await conn.exec_driver_sql(sql, params)
    return [tuple(row) for row in result.fetchall()]


def is_async(conn: Any) -> bool:
    """Whether ``conn`` is a SQLAlchemy ``AsyncConnection`` (SQLAlchemy is imported only by
    applications that use it: when it is not loaded, ``conn`` is not one)."""
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    return module is not None and isinstance(conn, module.AsyncConnection)


def atomic(conn: Any) -> contextlib.AbstractContextManager[Any]:
    """A transaction on pgjobs' autocommit connection, a savepoint in the caller's."""
    if isinstance(conn, psycopg.Connection):
        return conn.transaction()
    if hasattr(conn, "begin_nested") and not is_async(conn):
        nested: contextlib.AbstractContextManager[Any] = conn.begin_nested()
        return nested
    raise ConfigurationError(
        "connection must be a psycopg.Connection or a SQLAlchemy Connection "
        f"(use enqueue_async for an async one), got {type(conn).__name__}",
        field="connection",
    )


def atomic_async(conn: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """``atomic`` for an async connection."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn.transaction()
    nested: contextlib.AbstractAsyncContextManager[Any] = conn.begin_nested()
    return nested
