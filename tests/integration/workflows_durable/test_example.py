"""The guide's checkout example runs as the guide says: charged once, reserved, its items packed
by child jobs, waiting for the shipment's event, asleep in the queue for an hour, then
e-mailed."""

from __future__ import annotations

import threading
from datetime import timedelta

from examples import checkout_workflow as example
from pgjobs.worker import Worker, WorkerConfig
from tests.support.factories import db_now, row, work
from tests.support.helpers import wait_until


def test_the_checkout_example(conn, dsn):
    example.app.bind(dsn)
    conn.execute(example.PAYMENTS_DDL)
    try:
        job_id = example.app.enqueue(
            "shop.checkout",
            {"order_id": 42, "cents": 1999, "items": ["mug", "tea"], "email": "ada@example.com"},
        )
        config = WorkerConfig(queues=["orders"], poll_interval=0.02, maintenance=False)
        worker = Worker(example.app, config)
        running = threading.Thread(target=worker.run)
        running.start()
        try:
            wait_until(
                lambda: conn.execute(
                    "SELECT 1 FROM pgjobs_event_waits WHERE job_id = %s AND name = 'shipped'",
                    [job_id],
                ).fetchone(),
                timeout=60,
                what="the checkout to wait for its shipment",
            )
            packed = "SELECT count(*) FROM archived_jobs WHERE task = 'shop.pack'"
            assert conn.execute(packed).fetchone() == (2,)
            assert example.app.send_event(job_id, "shipped", {"tracking": "1Z999"}).woke
            wait_until(
                lambda: conn.execute(
                    "SELECT 1 FROM queued_jobs WHERE id = %s AND lease_owner IS NULL "
                    "AND run_at > now() + interval '1 minute'",
                    [job_id],
                ).fetchone(),
                timeout=60,
                what="the checkout to sleep",
            )
        finally:
            worker.stop()
            running.join()
        waiting = row(conn, "queued_jobs", job_id)
        assert waiting is not None and waiting["lease_owner"] is None
        assert timedelta(minutes=59) < waiting["run_at"] - db_now(conn) <= timedelta(hours=1)
        assert conn.execute("SELECT * FROM shop_payments").fetchall() == [(42, 1999)]
        assert example.reserved == [42] and example.sent == []
        assert conn.execute(packed).fetchone() == (2,), "the children ran once"

        # An hour later (the test moves the job's wake-up and its sleep's record to now).
        conn.execute("UPDATE queued_jobs SET run_at = now() WHERE id = %s", [job_id])
        conn.execute(
            "UPDATE pgjobs_workflow_history SET wake_at = now() WHERE job_id = %s", [job_id]
        )
        assert work(example.app, queues=["orders"]) == 0
        done = row(conn, "archived_jobs", job_id)
        assert done is not None
        assert done["result"] == {
            "payment": {"charged": 1999},
            "reservation": {"order_id": 42, "items": ["mug", "tea"]},
            "labels": ["42-mug", "42-tea"],
        }
        assert example.sent == ["ada@example.com: 19.99 EUR, 1Z999"]
        assert example.reserved == [42], "the recorded steps did not run again"
        assert conn.execute("SELECT count(*) FROM shop_payments").fetchone() == (1,)
    finally:
        conn.execute("DROP TABLE IF EXISTS shop_payments")
        example.app.close()
