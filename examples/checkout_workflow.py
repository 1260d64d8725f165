"""A checkout as a durable workflow: charge the card (its payment row written in the step's own
transaction, exactly once), reserve the stock, pack each item as a child job, wait for the
carrier's "shipped" event, wait an hour, e-mail the receipt with the tracking number.
tests/integration/workflows_durable/test_example.py runs it; the "Durable workflows" guide
shows it."""

from __future__ import annotations

from typing import Any

import pgjobs

app = pgjobs.App()

#: The application's own table the charge step writes to.
PAYMENTS_DDL = "CREATE TABLE IF NOT EXISTS shop_payments (order_id int PRIMARY KEY, cents int)"

#: Stand-ins for the application's services: a stock service and a mailer.
reserved: list[int] = []
sent: list[str] = []


class StockServiceDown(Exception):
    """The stock service did not answer: worth another try."""


@pgjobs.step_policy(attempts=5, retry=pgjobs.RetryPolicy(base=1, cap=30))
def reserve_stock(order_id: int, items: list[str]) -> dict[str, Any]:
    reserved.append(order_id)  # a call to the stock service
    return {"order_id": order_id, "items": items}


def send_receipt(email: str, cents: int, tracking: str) -> None:
    sent.append(f"{email}: {cents / 100:.2f} EUR, {tracking}")  # a call to the mailer


@app.task(name="shop.pack", queue="orders")
def pack(order_id: int, item: str) -> str:
    """A child job: one parcel label per item."""
    return f"{order_id}-{item}"


@app.workflow(name="shop.checkout", queue="orders")
def checkout(
    ctx: pgjobs.WorkflowContext, order_id: int, cents: int, items: list[str], email: str
) -> dict[str, Any]:
    def charge() -> dict[str, Any]:
        # Written in the step's transaction: it commits with the step's record, exactly once.
        ctx.transaction().execute(
            "INSERT INTO shop_payments (order_id, cents) VALUES (%s, %s)", [order_id, cents]
        )
        return {"charged": cents}

    payment = ctx.step("charge", charge)
    reservation = ctx.step("reserve", reserve_stock, order_id, items)
    # One child job per item; the workflow waits without a slot and gets their results in order.
    labels = ctx.map(pack, [{"order_id": order_id, "item": item} for item in items])
    # Sent by the carrier's webhook: app.send_event(job_id, "shipped", {"tracking": ...}).
    shipment = ctx.wait_for("shipped", timeout=7 * 86400)
    ctx.sleep(3600)  # the worker's slot is free meanwhile; no attempt is spent
    ctx.step("email", send_receipt, email, payment["charged"], shipment["tracking"])
    return {"payment": payment, "reservation": reservation, "labels": labels}
