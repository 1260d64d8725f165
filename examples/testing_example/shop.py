"""A small shop whose work happens in background jobs: the app that ``test_shop.py`` tests with
``pgjobs.testing``.

Signing up enqueues a welcome email; an order enqueues a charge (whose payment gateway times out
on the first attempt) and a receipt built by an async handler.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgjobs

# No DSN here: in production it comes from $PGJOBS_DATABASE_URL; the tests bind the app to their
# throwaway database (the pgjobs_app fixture).
app = pgjobs.App()

#: Emails "sent", as (to, subject): a stand-in for an email service.
OUTBOX: list[tuple[str, str]] = []


@app.task(name="emails.welcome", queue="emails")
def send_welcome(to: str) -> str:
    """Send the welcome email."""
    OUTBOX.append((to, "Welcome!"))
    return f"sent to {to}"


@app.task(name="billing.charge", max_attempts=3, retry_base=1, retry_cap=5)
def charge(order_id: int, amount: float) -> dict[str, Any]:
    """Charge an order. A negative amount is a bug, never worth retrying; the gateway times out
    on the first attempt of every charge (so the tests see a retry)."""
    if amount <= 0:
        raise pgjobs.NonRetryableError(f"order {order_id}: amount {amount} is not positive")
    if pgjobs.current_job().job.attempts == 1:
        raise TimeoutError("payment gateway timed out")
    return {"order_id": order_id, "charged": amount}


@app.task(name="receipts.build")
async def build_receipt(order_id: int) -> str:
    """Build the receipt of an order (async: it would call other services)."""
    await asyncio.sleep(0)
    return f"receipt-{order_id}.pdf"


def sign_up(email: str) -> int:
    """Create the account (elsewhere) and enqueue its welcome email; returns the job id."""
    return app.enqueue(send_welcome, {"to": email})


def place_order(order_id: int, amount: float, *, ship_in: float | None = None) -> list[int]:
    """Enqueue the charge now and the receipt (``ship_in`` seconds later, if given)."""
    return [
        app.enqueue(charge, {"order_id": order_id, "amount": amount}),
        app.enqueue(build_receipt, {"order_id": order_id}, run_in=ship_in),
    ]
