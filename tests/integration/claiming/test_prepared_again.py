"""The libpq path's statements are prepared once per connection; when the server no longer has
one (``DEALLOCATE ALL``, ``DISCARD ALL`` by a session pooler's reset query), the statement that
finds out fails, and the next one prepares it again instead of failing the same way for ever:
what kept a worker behind a transaction-mode PgBouncer from ever claiming again."""

from __future__ import annotations

import asyncio

import pytest

from pgjobs import JobSpec, db
from pgjobs.completer import ClaimParams
from pgjobs.completer.trip import settle_and_claim
from pgjobs.db import libpq
from pgjobs.db.dsn import Dsn
from pgjobs.errors import QueryFailed

CLAIM = ClaimParams("worker-a", ["default"], lease=300.0)


def test_a_claim_prepares_again_what_the_server_dropped(dsn: Dsn, make_app) -> None:
    make_app(check_task_names=False).enqueue_many(JobSpec("t", {"n": n}) for n in range(3))

    async def scenario() -> list[int]:
        aconn = await db.connect_async(dsn, hot=True)
        try:
            claimed = []
            first = await settle_and_claim(aconn, None, None, CLAIM, 1)
            claimed.append(len(first.claimed))
            await aconn.execute("DEALLOCATE ALL")  # as DISCARD ALL would
            with pytest.raises(QueryFailed, match="does not exist"):
                await settle_and_claim(aconn, None, None, CLAIM, 1)
            again = await settle_and_claim(aconn, None, None, CLAIM, 1)
            claimed.append(len(again.claimed))
            return claimed
        finally:
            await aconn.close()

    assert asyncio.run(scenario()) == [1, 1]


def test_an_enqueue_prepares_again_what_the_server_dropped(dsn: Dsn) -> None:
    params: dict[str, libpq.Param] = {
        "queue": "default", "task": "t", "payload": "{}", "priority": 0, "max_attempts": 3,
    }  # fmt: skip
    with db.connect(dsn) as conn:
        libpq.insert_ready(conn, params)
        conn.execute("DEALLOCATE ALL")
        with pytest.raises(QueryFailed, match="does not exist"):
            libpq.insert_ready(conn, params)
        assert libpq.insert_ready(conn, params) > 0
