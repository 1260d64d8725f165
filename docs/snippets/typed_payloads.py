# Typed payloads: annotations are checked at enqueue and again when a worker starts the job.
# tests/integration/docs/test_doc_snippets.py runs this file and the calls the page shows.
from dataclasses import dataclass
from typing import Literal

import pgjobs

app = pgjobs.App()


@app.task(name="billing.refund")
def refund(
    order_id: int, amount: float, reason: Literal["damaged", "late"], note: str | None = None
) -> None: ...


# A handler whose single parameter is a dataclass (or a pydantic model) gets an instance.
@dataclass
class Shipment:
    order_id: int
    carrier: str
    weight_kg: float = 0.0


@app.task(name="shipping.book")
def book(shipment: Shipment) -> str:
    return shipment.carrier
