"""Django with pgjobs: enqueue on Django's own database connection inside
``transaction.atomic``, so the job commits or rolls back with the rest of the transaction.

Django's PostgreSQL backend runs on psycopg 3 when it is installed (pgjobs needs it anyway):
``connection.connection`` is then the psycopg connection of the current transaction, which
``App.enqueue(connection=...)`` joins. ``transaction.on_commit`` is the alternative when the
enqueue must not be part of the transaction: the job is then enqueued after the commit, and lost
if the process dies in between, so prefer the same connection.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

import django
from django.conf import settings

import pgjobs

DATABASE_URL = os.environ.get("PGJOBS_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")


def configure() -> None:
    """Minimal settings from $PGJOBS_DATABASE_URL (a project has its own settings.py)."""
    if settings.configured:
        return
    url = urlsplit(DATABASE_URL)
    query = parse_qs(url.query)  # postgresql://user@/db?host=/run/postgresql: a socket directory
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": url.path.lstrip("/"),
                "USER": url.username or "",
                "PASSWORD": url.password or "",
                "HOST": url.hostname or query.get("host", [""])[0],
                "PORT": str(url.port or ""),
            }
        },
        USE_TZ=True,
    )
    django.setup()


jobs = pgjobs.App(DATABASE_URL)


@jobs.task(name="orders.confirm")
def confirm_order(order_id: int) -> None:
    """Send the confirmation (here: nothing)."""


def place_order(item: str, *, fail_after_enqueue: bool = False) -> int:
    """Insert an order and enqueue its confirmation in one Django transaction."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, item text)"
            )
            cursor.execute("INSERT INTO example_orders (item) VALUES (%s) RETURNING id", [item])
            (order_id,) = cursor.fetchone()
        jobs.enqueue(confirm_order, {"order_id": order_id}, connection=connection.connection)
        if fail_after_enqueue:
            raise RuntimeError("payment refused")  # rolls back the order and its job
    return int(order_id)


def place_order_on_commit(item: str) -> None:
    """The alternative: enqueue once Django has committed (outside the transaction)."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO example_orders (item) VALUES (%s) RETURNING id", [item])
            (order_id,) = cursor.fetchone()
        transaction.on_commit(lambda: jobs.enqueue(confirm_order, {"order_id": order_id}))
