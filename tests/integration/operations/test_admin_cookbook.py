"""The SQL cookbook (docs/snippets/cookbook.sql, which the manual's cookbook page shows) runs as
printed, and its fingerprint query counts exactly what `pgjobs dead group` counts."""

from __future__ import annotations

import re

from pgjobs import App, admin
from pgjobs.models import DeadReason
from tests.support.admin_factories import bury, claim_one, succeed
from tests.support.helpers import REPO

COOKBOOK = REPO / "docs" / "snippets" / "cookbook.sql"
#: The lines that mark a section of the file for the pages that show one statement of it.
SECTION_MARK = re.compile(r"^-- --8<-- \[(start|end):[\w-]+\]$")


def cookbook() -> list[str]:
    """The file's statements, each starting with its title comment."""
    lines = [line for line in COOKBOOK.read_text().splitlines() if not SECTION_MARK.match(line)]
    chunks = "\n".join(lines).split(";\n")
    statements = []
    for chunk in chunks:
        # A statement's own comment lines start at the first line after the blank one before it.
        body = chunk.strip().split("\n\n")[-1].strip()
        if body:
            statements.append(body)
    assert len(statements) >= 6
    return statements


def test_every_cookbook_query_runs_and_the_fingerprints_match_dead_group(make_app, conn, dsn):
    app: App = make_app(check_task_names=False)
    done = app.enqueue("t.ok", {})
    succeed(conn, claim_one(conn, done))
    app.enqueue("t.waiting", {})
    bury(conn, 40, task="sync", error=lambda n: f"ConnectionError: host 10.0.0.{n} id {n:08x}")
    bury(conn, 3, task="img", error=lambda n: f"ValueError: file 'a{n}.png' is corrupt")
    bury(
        conn,
        2,
        task="gone",
        reason=DeadReason.LEASE_EXPIRED,
        error_type=None,
        error=lambda n: f"w{n}",
    )

    results = {}
    for statement in cookbook():
        title = statement.splitlines()[0]
        results[title] = conn.execute(statement).fetchall()

    (by_fingerprint,) = [rows for title, rows in results.items() if "fingerprint" in title]
    assert sorted((task, fp, n) for task, fp, n, _, _ in by_fingerprint) == sorted(
        (g.task, g.fingerprint, g.count) for g in admin.dead_groups(dsn)
    )
    assert len(by_fingerprint) == 3
    (timing,) = [rows for title, rows in results.items() if "Run time" in title]
    ((task, jobs, run_p50, run_p99, pickup_p99),) = timing
    assert (task, jobs) == ("t.ok", 1) and 0 <= run_p50 <= run_p99 < 60 and 0 <= pickup_p99 < 60
    (top,) = [rows for title, rows in results.items() if "Top failing" in title]
    assert top[0] == ("sync", 40, 0)
    (timed_out,) = [rows for title, rows in results.items() if "timeout" in title]
    assert timed_out == []
