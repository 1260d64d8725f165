"""The triggers a migrated database runs are the text ``pgjobs.queries.triggers`` shows."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs.queries import triggers


def _body(function: str) -> str:
    """What PostgreSQL keeps of a CREATE FUNCTION ... AS $fn$ body $fn$: the body itself."""
    return function.split("$fn$", 2)[1]


def _words(condition: str) -> list[str]:
    return condition.replace("(", " ").replace(")", " ").lower().split()


def test_the_migrated_function_is_the_one_queries_shows(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = 'pgjobs_job_ended'").fetchone()
    assert row is not None, "the migrated database has no pgjobs_job_ended()"
    assert row[0] == _body(triggers.JOB_ENDED_FUNCTION)


def test_the_migrated_triggers_fire_when_queries_says(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        """
        SELECT c.relname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE t.tgname = 'pgjobs_job_ended' AND t.tgparentid = 0  -- not the partitions' clones
        ORDER BY c.relname
        """
    ).fetchall()
    assert [table for table, _ in rows] == sorted(table for table, _ in triggers.JOB_ENDED_TABLES)
    kinds = dict(triggers.JOB_ENDED_TABLES)
    for table, definition in rows:
        assert f"AFTER INSERT ON public.{table} FOR EACH ROW" in definition
        # PostgreSQL prints the condition in its own spelling (lower-case NEW, its own
        # parentheses): compare the words.
        when = definition.split(" WHEN ", 1)[1].split(" EXECUTE ", 1)[0]
        assert _words(when) == _words(triggers.JOB_ENDED_WHEN)
        assert definition.endswith(f"EXECUTE FUNCTION pgjobs_job_ended('{kinds[table]}')")


def test_the_children_trigger_is_the_one_queries_shows(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = 'pgjobs_children_ended'"
    ).fetchone()
    assert row is not None, "the migrated database has no pgjobs_children_ended()"
    assert row[0] == _body(triggers.CHILDREN_ENDED_FUNCTION)
    definition = conn.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'pgjobs_children_ended'"
    ).fetchone()
    assert definition is not None
    when = definition[0].split(" WHEN ", 1)[1].split(" EXECUTE ", 1)[0]
    assert _words(when) == _words(triggers.CHILDREN_ENDED_WHEN)
    assert "AFTER UPDATE OF pending ON public.pgjobs_batches FOR EACH ROW" in definition[0]
