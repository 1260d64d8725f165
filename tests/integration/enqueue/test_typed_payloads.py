"""Typed payloads against a real PostgreSQL: an annotated handler's payload is checked at enqueue
(nothing written) and again when a worker starts the job (dead_letter, invalid_payload, naming
the field); a handler taking one dataclass or pydantic model receives the instance."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Literal

import psycopg
import pydantic
import pytest

from pgjobs import App, InvalidPayload, JobSpec
from tests.support.factories import insert_raw, row, work
from tests.support.helpers import assert_one_home, count

# Models live at module level: annotations are strings here (PEP 563), resolved against the
# module's globals when the task is registered.


@dataclasses.dataclass
class Refund:
    order_id: int
    amount: float
    reason: Literal["damaged", "late", "other"] = "other"


class Shipment(pydantic.BaseModel):
    order_id: int
    carrier: str
    weight_kg: float


def test_enqueue_refuses_a_value_of_the_wrong_type_naming_the_field(make_app, conn) -> None:
    app: App = make_app()

    @app.task(name="t.pay")
    def pay(amount: float, user_id: int, tags: list[str] | None = None) -> None: ...

    with pytest.raises(InvalidPayload) as refused:
        app.enqueue("t.pay", {"amount": "abc", "user_id": 1})
    assert refused.value.field == "payload.amount"
    assert str(refused.value) == "payload.amount: expected float, got str"

    with pytest.raises(InvalidPayload) as refused:
        app.enqueue(pay, {"amount": 1, "user_id": True})
    assert refused.value.field == "payload.user_id"
    assert "expected int, got bool" in str(refused.value)

    with pytest.raises(InvalidPayload) as refused:
        app.enqueue_many(
            [
                JobSpec("t.pay", {"amount": 2.5, "user_id": 1}),
                JobSpec("t.pay", {"amount": 2.5, "user_id": 2, "tags": ["a", 7]}),
            ]
        )
    assert refused.value.field == "jobs[1].payload.tags"
    assert "payload.tags[1]: expected str, got int" in str(refused.value)
    assert count(conn, "queued_jobs") == 0  # nothing of a refused call is written

    # An int is a JSON number where a float is expected; None fits an Optional.
    ok = app.enqueue("t.pay", {"amount": 3, "user_id": 1, "tags": None})
    assert ok > 0 and count(conn, "queued_jobs") == 1


def test_enqueue_async_checks_the_same_way(make_app) -> None:
    app: App = make_app()

    @app.task(name="t.pay")
    def pay(amount: float) -> None: ...

    async def main() -> None:
        async with app:
            await app.enqueue_async("t.pay", {"amount": [1]})

    with pytest.raises(InvalidPayload) as refused:
        asyncio.run(main())
    assert refused.value.field == "payload.amount"


def test_the_worker_dead_letters_a_stored_value_of_the_wrong_type(make_app, conn) -> None:
    app: App = make_app()
    received: list[float] = []

    @app.task(name="t.pay")
    def pay(amount: float, user_id: int) -> None:
        received.append(amount)

    # What another producer (no registry, an old release, hand-written SQL) may have stored.
    wrong = insert_raw(conn, "t.pay", '{"amount": "abc", "user_id": 1}')
    nested = insert_raw(conn, "t.pay", '{"amount": 1.5, "user_id": "7"}')
    good = app.enqueue("t.pay", {"amount": 4, "user_id": 1})

    assert work(app) == 0

    assert received == [4]  # "abc" never reached the float parameter
    where = assert_one_home(conn, [wrong, nested, good])
    assert where == {wrong: "dead_letter", nested: "dead_letter", good: "archived_jobs"}
    dead = row(conn, "dead_letter", wrong)
    assert dead is not None and dead["reason"] == "invalid_payload"
    assert dead["last_error"] == "payload.amount: expected float, got str"
    assert dead["attempts"] == 1
    dead = row(conn, "dead_letter", nested)
    assert dead is not None and dead["last_error"] == "payload.user_id: expected int, got str"


def test_a_dataclass_handler_receives_the_instance_and_enqueue_takes_either_form(
    make_app, conn
) -> None:
    app: App = make_app()
    received: list[Refund] = []

    @app.task(name="t.refund")
    def refund(refund: Refund) -> str:
        received.append(refund)
        return f"{refund.order_id}:{refund.amount}:{refund.reason}"

    as_dict = app.enqueue("t.refund", {"order_id": 1, "amount": 9.5})
    as_instance = app.enqueue(refund, Refund(2, 3, "late"))  # type: ignore[arg-type]
    stored = conn.execute("SELECT payload FROM queued_jobs WHERE id = %s", [as_instance]).fetchone()
    assert stored is not None and stored[0] == {"order_id": 2, "amount": 3, "reason": "late"}

    with pytest.raises(InvalidPayload) as refused:
        app.enqueue("t.refund", {"order_id": 3, "amount": 1, "reason": "lost"})
    assert refused.value.field == "payload.reason"
    assert "expected Literal['damaged', 'late', 'other'], got str 'lost'" in str(refused.value)
    with pytest.raises(InvalidPayload) as refused:
        app.enqueue("t.refund", {"amount": 1})
    assert refused.value.field == "payload.order_id"
    bad = insert_raw(conn, "t.refund", '{"order_id": 4, "amount": "ten"}')

    assert work(app, concurrency=1) == 0

    assert sorted(received, key=lambda r: r.order_id) == [Refund(1, 9.5), Refund(2, 3, "late")]
    assert row(conn, "archived_jobs", as_dict)["result"] == "1:9.5:other"  # type: ignore[index]
    dead = row(conn, "dead_letter", bad)
    assert dead is not None and dead["reason"] == "invalid_payload"
    assert dead["last_error"] == "payload.amount: expected float, got str"
    assert_one_home(conn, [as_dict, as_instance, bad])


def test_a_pydantic_handler_receives_the_validated_model(make_app, conn) -> None:
    app: App = make_app()
    received: list[Shipment] = []

    @app.task(name="t.ship")
    async def ship(shipment: Shipment) -> None:
        received.append(shipment)

    as_dict = app.enqueue("t.ship", {"order_id": 1, "carrier": "dhl", "weight_kg": 2})
    as_model = app.enqueue(ship, Shipment(order_id=2, carrier="ups", weight_kg=0.5))  # type: ignore[arg-type]
    with pytest.raises(InvalidPayload) as refused:
        app.enqueue("t.ship", {"order_id": 3, "carrier": "dhl", "weight_kg": "heavy"})
    assert refused.value.field == "payload.weight_kg"
    assert str(refused.value).startswith("payload.weight_kg: ")
    assert "(got str)" in str(refused.value)
    bad = insert_raw(conn, "t.ship", '{"order_id": 4, "carrier": "dhl"}')

    assert work(app) == 0

    assert sorted(s.order_id for s in received) == [1, 2]
    assert all(isinstance(s, Shipment) for s in received)
    dead = row(conn, "dead_letter", bad)
    assert dead is not None and dead["reason"] == "invalid_payload"
    assert dead["last_error"].startswith("payload.weight_kg: Field required")
    assert_one_home(conn, [as_dict, as_model, bad])


def test_untyped_and_unresolvable_handlers_are_not_checked(make_app, conn) -> None:
    app: App = make_app()
    seen: list[Any] = []

    @app.task(name="t.loose")
    def loose(value):
        seen.append(value)

    @app.task(name="t.lazy")
    def lazy(value: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
        seen.append(value)

    assert app.tasks["t.loose"].types is None and app.tasks["t.lazy"].types is None
    ids = [app.enqueue("t.loose", {"value": "x"}), app.enqueue("t.lazy", {"value": [1]})]
    assert work(app, concurrency=1) == 0
    assert sorted(map(str, seen)) == ["[1]", "x"]
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}


def test_checks_hold_inside_the_callers_transaction(make_app, dsn) -> None:
    app: App = make_app()

    @app.task(name="t.pay")
    def pay(amount: float) -> None: ...

    with psycopg.connect(dsn.url) as own:
        with pytest.raises(InvalidPayload):
            app.enqueue("t.pay", {"amount": "1"}, connection=own)
        # The refusal sent nothing: the caller's transaction is intact and can go on.
        assert own.execute("SELECT 1").fetchone() == (1,)
