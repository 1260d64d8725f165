"""Migration 0003 (redrive record, replay link) upgrades and downgrades with jobs in place."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs import App, admin, migrate
from pgjobs.admin import DeadFilter
from tests.support.admin_factories import bury
from tests.support.helpers import assert_one_home

NEW_COLUMNS = {"redrive_count", "redriven_at", "replay_of"}


def columns(conn: psycopg.Connection[Any], table: str) -> set[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s", [table]
    ).fetchall()
    return {str(r[0]) for r in rows}


def test_0003_keeps_the_jobs_both_ways(create_database):
    fresh = create_database()
    migrate.upgrade(fresh, "0002")
    with App(fresh.url, check_task_names=False) as app:
        queued = app.enqueue("t", {"before": "0003"})
    with psycopg.connect(fresh.url, autocommit=True) as conn:
        migrate.upgrade(fresh, "0003")
        for table in ("queued_jobs", "archived_jobs", "dead_letter"):
            assert columns(conn, table) >= NEW_COLUMNS
        before = conn.execute(
            "SELECT redrive_count, redriven_at, replay_of FROM queued_jobs WHERE id = %s",
            [queued],
        ).fetchone()
        assert before == (0, None, None), "existing rows get the defaults"
        migrate.upgrade(fresh)  # the operations of this version run on the newest schema

        (dead,) = bury(conn, 1)
        assert admin.redrive(fresh, DeadFilter(ids=(dead,))) == 1
        replay = admin.replay(fresh, admin.cancel(fresh, queued).id)
        (buried,) = bury(conn, 1)

        migrate.downgrade(fresh, "0002")
        for table in ("queued_jobs", "archived_jobs", "dead_letter"):
            assert not columns(conn, table) & NEW_COLUMNS
        where = assert_one_home(conn, [queued, dead, replay, buried])
        assert where == {
            queued: "archived_jobs",
            dead: "queued_jobs",
            replay: "queued_jobs",
            buried: "dead_letter",
        }

        migrate.upgrade(fresh, "0003")
        assert conn.execute("SELECT max(redrive_count) FROM queued_jobs").fetchone() == (0,)
