# Payload versions: a worker upgrades an older payload step by step before the call.
# tests/integration/docs/test_doc_snippets.py enqueues a version-1 payload and runs it.
from typing import Any

import pgjobs

app = pgjobs.App()


def to_cents(payload: dict[str, Any]) -> dict[str, Any]:  # version 1 -> version 2
    return {"order": payload["order"], "cents": round(payload["amount"] * 100)}


def add_currency(payload: dict[str, Any]) -> dict[str, Any]:  # version 2 -> version 3
    return {**payload, "currency": "EUR"}


@app.task(name="billing.charge", version=3, upgrade={1: to_cents, 2: add_currency})
def charge(order: int, cents: int, currency: str) -> str:
    return f"{order}: {cents} {currency}"
