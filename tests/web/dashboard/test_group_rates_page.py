"""A queue's page says which of its groups a group rate holds (the queue's, or a task's), and
until when: the same read as `pgjobs stats` (``pgjobs.groups.load``)."""

from __future__ import annotations

from typing import Any

import psycopg

from pgjobs import queues
from pgjobs.db.dsn import Dsn
from tests.integration.claiming.test_claim_groups import enqueue
from tests.support.factories import claim_limited, declared_task
from tests.web.conftest import TestClient
from tests.web.dashboard.test_groups_page import rows


def test_the_queue_page_shows_groups_held_by_their_rate(
    signed_in: TestClient, conn: psycopg.Connection[Any], dsn: Dsn
) -> None:
    queues.limit(dsn, "tenants", group_rate="2/h")
    enqueue(conn, "t", "customer-1", 3, queue="tenants")
    enqueue(conn, "crm.sync", "customer-2", 2, queue="tenants")
    enqueue(conn, "t", "customer-3", 2, queue="tenants")
    sync = declared_task("crm.sync", group_rate="1/h")
    claimed, _ = claim_limited(conn, [declared_task("t"), sync], queues=["tenants"], limit=5)
    assert len(claimed) == 5  # 2 of customer-1, 1 of customer-2, 2 of customer-3
    html = signed_in.get("/queues/tenants").text
    found = rows(html)
    assert found["customer-1"][:3] == ["1", "2", "no"]
    assert found["customer-1"][3].startswith(
        "the queue's group rate 2/h: 2 starts in its window, the next at "
    )
    assert found["customer-2"][3].startswith(
        "crm.sync's group rate 1/h: 1 start in its window, the next at "
    )
    assert found["customer-3"][3] == "-"  # its rate reached, but nothing ready to hold
    assert "2/h starts per group" in html[html.index('id="limits"') :]
