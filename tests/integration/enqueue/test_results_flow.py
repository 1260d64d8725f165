"""Results flowing from job to job: a dependent reads the results of the jobs it waited for, by
id and by the names given at enqueue (``after={"charge": a}``), from sync and async handlers; a
batch's callback (and anyone, through the app) reads its members' results and outcomes a page at
a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgjobs
from pgjobs import (
    App,
    BatchNotFound,
    ConfigurationError,
    JobFailed,
    JobNotFound,
    JobSpec,
    JobStatus,
    NonRetryableError,
    PgjobsError,
    Ref,
    flow,
)
from pgjobs.testing import drain
from tests.support.factories import counts, work
from tests.support.helpers import assert_one_home, scalar


def names(conn: psycopg.Connection[Any], job_id: int) -> dict[int, str | None]:
    """The edges of job ``job_id``: dependency id -> name."""
    rows = conn.execute(
        "SELECT depends_on, name FROM pgjobs_dependencies WHERE job_id = %s", [job_id]
    ).fetchall()
    return dict(rows)


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app()
    app.seen = []  # type: ignore[attr-defined]

    @app.task(name="shop.charge")
    def charge(order: int) -> dict[str, Any]:
        return {"receipt": f"r-{order}"}

    @app.task(name="shop.stock")
    async def stock(order: int) -> dict[str, Any]:
        return {"shelf": order % 7}

    @app.task(name="shop.ship")
    def ship(order: int) -> dict[str, Any]:
        results = pgjobs.current_job().dependency_results()
        app.seen.append(results)  # type: ignore[attr-defined]
        return {"label": f"{results['charge']['receipt']}@{results['stock']['shelf']}"}

    @app.task(name="shop.ship_async")
    async def ship_async(order: int) -> dict[str, Any]:
        results = await pgjobs.current_job().dependency_results_async()
        app.seen.append(results)  # type: ignore[attr-defined]
        return {"label": f"{results['charge']['receipt']}@{results['stock']['shelf']}"}

    @app.task(name="shop.fail", max_attempts=1)
    def fail(order: int) -> None:
        raise NonRetryableError(f"order {order} declined")

    return app


@pytest.mark.parametrize("handler", ["shop.ship", "shop.ship_async"])
def test_a_dependent_reads_its_dependencies_results_by_name_and_by_id(app, conn, handler):
    charge = app.enqueue("shop.charge", {"order": 12})
    stock = app.enqueue("shop.stock", {"order": 12})
    ship = app.enqueue(handler, {"order": 12}, after={"charge": charge, "stock": stock})
    assert names(conn, ship) == {charge: "charge", stock: "stock"}
    result = drain(app)
    assert result.succeeded == [charge, stock, ship]
    assert app.wait(ship, timeout=10) == {"label": "r-12@5"}
    (seen,) = app.seen
    assert seen[charge] == seen["charge"] == {"receipt": "r-12"}
    assert seen[stock] == {"shelf": 5}
    assert list(seen) == [charge, stock] and len(seen) == 2
    assert seen.names == {"charge": charge, "stock": stock}
    assert "charge" in seen and stock in seen and "other" not in seen
    with pytest.raises(KeyError):
        seen["other"]
    assert seen.get(999_999, "none") == "none"
    outcome = seen.outcome("stock")
    assert (outcome.id, outcome.name, outcome.status) == (stock, "stock", JobStatus.SUCCEEDED)
    assert_one_home(conn, [charge, stock, ship])


def test_a_real_worker_gives_sync_and_async_handlers_the_results(app, conn):
    charge = app.enqueue("shop.charge", {"order": 3})
    stock = app.enqueue("shop.stock", {"order": 3})
    by_name = app.enqueue("shop.ship", {"order": 3}, after={"charge": charge, "stock": stock})
    by_name_async = app.enqueue(
        "shop.ship_async", {"order": 3}, after={"charge": charge, "stock": stock}
    )
    work(app, concurrency=4)
    assert app.wait(by_name, timeout=10) == app.wait(by_name_async, timeout=10)
    assert app.wait(by_name, timeout=10) == {"label": "r-3@3"}
    assert_one_home(conn, [charge, stock, by_name, by_name_async])


def test_a_list_form_reads_by_id_only_and_a_graph_names_refs(app: App, conn: Any) -> None:
    seen: dict[int, Any] = {}

    @app.task(name="shop.collect")
    def collect() -> None:
        job = pgjobs.current_job()
        seen[job.job.id] = job.dependency_results()

    first = app.enqueue("shop.charge", {"order": 1})
    by_id = app.enqueue("shop.collect", after=[first])
    assert names(conn, by_id) == {first: None}
    ids = app.enqueue_many(
        [
            JobSpec("shop.charge", {"order": 2}),
            JobSpec("shop.stock", {"order": 2}, idempotency_key="stock-2"),
            JobSpec("shop.collect", after={"charge": Ref(0), "stock": Ref(1), "older": first}),
            # A keyed dependent: its edges are attached after the keyed insert.
            JobSpec("shop.collect", after={"charge": Ref(0)}, unique_key="collect-2"),
        ]
    )
    assert names(conn, ids[2]) == {ids[0]: "charge", ids[1]: "stock", first: "older"}
    assert names(conn, ids[3]) == {ids[0]: "charge"}
    drain(app)
    plain, named, keyed = seen[by_id], seen[ids[2]], seen[ids[3]]
    assert plain.names == {} and plain[first] == {"receipt": "r-1"}
    assert named["older"] == {"receipt": "r-1"} and named["stock"] == {"shelf": 2}
    assert keyed["charge"] == {"receipt": "r-2"} and list(keyed) == [ids[0]]


def test_a_pruned_dependencys_result_is_gone_and_the_others_still_read(app: App, conn: Any) -> None:
    reads: list[Any] = []

    @app.task(name="shop.late")
    def late() -> None:
        results = pgjobs.current_job().dependency_results()
        reads.append(results["stock"])
        try:
            results["charge"]
        except JobNotFound as exc:
            reads.append(str(exc))
        reads.append(results.outcome("charge").status)

    charge = app.enqueue("shop.charge", {"order": 5})
    stock = app.enqueue("shop.stock", {"order": 5})
    drain(app)
    # Both succeeded (met at once): the dependent is ready, and reads them from the archive...
    late_id = app.enqueue("shop.late", after={"charge": charge, "stock": stock})
    # ...but charge's archived row leaves first, as `pgjobs prune` drops its partition.
    conn.execute("DELETE FROM archived_jobs WHERE id = %s", [charge])
    assert drain(app).succeeded == [late_id]
    assert reads[0] == {"shelf": 5}
    assert f"job {charge} (charge) is in no pgjobs table" in reads[1] and "pruned" in reads[1]
    assert reads[2] is None


def test_a_failed_dependency_kills_the_dependent_unrun_and_a_redriven_one_reads_the_failure(
    app, conn
):
    failed = app.enqueue("shop.fail", {"order": 9})
    stock = app.enqueue("shop.stock", {"order": 9})
    ship = app.enqueue("shop.ship", {"order": 9}, after={"charge": failed, "stock": stock})
    drain(app)
    assert app.seen == []  # never ran
    assert scalar(conn, "SELECT reason FROM dead_letter WHERE id = %s", [ship]) == (
        "dependency_failed"
    )
    assert app.redrive(ship) == 1
    drain(app)
    (seen,) = app.seen
    assert seen["stock"] == {"shelf": 2}
    with pytest.raises(JobFailed, match="declined"):
        seen["charge"]
    assert seen.outcome("charge").status is JobStatus.DEAD
    assert_one_home(conn, [failed, stock, ship])


def test_bad_names_are_one_line_errors_and_write_nothing(app, conn):
    first = app.enqueue("shop.charge", {"order": 1})
    before = counts(conn)
    bad: list[tuple[Any, str]] = [
        ({"a": first, "b": first}, "twice"),
        ({"": first}, "non-empty"),
        ({" x": first}, "space"),
        ({7: first}, "non-empty string"),
        ({"a": "x"}, "a job id is a whole number"),
        ({"a": True}, "a job id is a whole number"),
        ("charge", "mapping of names"),
    ]
    for after, words in bad:
        with pytest.raises(ConfigurationError, match=words) as caught:
            app.enqueue("shop.ship", {"order": 1}, after=after)
        assert caught.value.field == "after"
    with pytest.raises(ConfigurationError, match="twice"):
        app.enqueue_many(
            [JobSpec("shop.charge"), JobSpec("shop.ship", after={"a": Ref(0), "b": Ref(0)})]
        )
    assert counts(conn) == before
    assert scalar(conn, "SELECT count(*) FROM pgjobs_dependencies") == 0


def test_reading_results_is_refused_where_it_cannot_work(app: App, conn: Any) -> None:
    @app.task(name="shop.blocking", max_attempts=1)
    async def blocking() -> None:
        pgjobs.current_job().dependency_results()

    @app.task(name="shop.not_a_callback", max_attempts=1)
    def not_a_callback(batch: dict[str, Any]) -> None:
        list(pgjobs.current_job().batch_results())

    first = app.enqueue("shop.blocking")
    second = app.enqueue("shop.not_a_callback", {"batch": {"id": 1}})
    third = app.enqueue("shop.not_a_callback", {"batch": {"id": "x"}})
    drain(app)
    errors = dict(
        conn.execute(
            "SELECT id, last_error FROM dead_letter WHERE id = ANY(%s)", [[first, second, third]]
        ).fetchall()
    )
    assert "use dependency_results_async()" in errors[first]
    assert "is not the callback of batch 1" in errors[second]
    assert "is no batch's callback" in errors[third]
    context = pgjobs.JobContext(None, lambda *_: None)  # type: ignore[arg-type]
    with pytest.raises(PgjobsError, match="not under eager"):
        context.dependency_results()


# -- batches ----------------------------------------------------------------------------------


@pytest.fixture
def batch_app(make_app: Callable[..., App]) -> App:
    app = make_app()
    app.read = []  # type: ignore[attr-defined]

    @app.task(name="rows.count")
    def count_rows(n: int) -> dict[str, int]:
        if n < 0:
            raise NonRetryableError(f"no rows in {n}")
        return {"rows": n}

    @app.task(name="rows.total", queue="totals")
    def total(batch: dict[str, int], page_size: int = 1000) -> int:
        members = pgjobs.current_job().batch_results(page_size=page_size)
        read = [(m.id, m.status, m.result, m.reason) for m in members]
        app.read.append(read)  # type: ignore[attr-defined]
        return sum(result["rows"] for _, status, result, _ in read if status == "succeeded")

    @app.task(name="rows.total_async", queue="totals")
    async def total_async(batch: dict[str, int]) -> int:
        seen: list[flow.JobResult] = [
            m async for m in pgjobs.current_job().batch_results_async(page_size=3)
        ]
        read = [(m.id, m.status, m.result, m.reason) for m in seen]
        app.read.append(read)  # type: ignore[attr-defined]
        return sum(m.result["rows"] for m in seen if m.succeeded)

    return app


@pytest.mark.parametrize("callback", ["rows.total", "rows.total_async"])
def test_a_callback_reads_its_members_results_and_outcomes(batch_app, conn, callback):
    with batch_app.batch(on_complete=(callback, {})) as batch:
        for n in (1, 2, -1, 3, 4, 5, 6, 7):
            batch.enqueue("rows.count", {"n": n})
    drain(batch_app)
    callback_id = scalar(
        conn, "SELECT callback_job_id FROM pgjobs_batches WHERE id = %s", [batch.id]
    )
    assert batch_app.wait(callback_id, timeout=10) == 28
    (read,) = batch_app.read
    assert [member[0] for member in read] == batch.ids
    dead = [member for member in read if member[1] is JobStatus.DEAD]
    assert [(m[0], m[2], m[3]) for m in dead] == [(batch.ids[2], None, "non_retryable")]


def test_a_ten_thousand_member_batch_is_read_page_by_page(batch_app, dsn, conn):
    size = 10_000
    specs = [JobSpec("rows.count", {"n": n}) for n in range(size)]
    batch = batch_app.batch(on_complete=("rows.total", {"page_size": 1000}))
    ids = batch_app.enqueue_many(specs, batch=batch)
    work(batch_app, concurrency=8)
    (read,) = batch_app.read
    assert [member[0] for member in read] == ids
    assert sum(member[2]["rows"] for member in read) == sum(range(size))

    # Through the app, page by page with the cursor: each page bounded, none read twice.
    pages, after, seen = 0, 0, list[int]()
    while True:
        page = batch_app.batch_results_page(batch.id, after=after, limit=2500)
        assert 0 < len(page.results) <= 2500
        seen.extend(member.id for member in page.results)
        pages += 1
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == ids and pages == 4

    # The iterator reads one page per statement, lazily: the memory of one page at a time.
    class Counting:
        def __init__(self) -> None:
            self.inner = flow.Direct(dsn)
            self.reads = 0

        def run(self, work_on: Any) -> Any:
            self.reads += 1
            return self.inner.run(work_on)

        async def run_async(self, work_on: Any) -> Any:
            self.reads += 1
            return await self.inner.run_async(work_on)

    counting = Counting()
    members = flow.iter_batch(counting, batch.id, page_size=1000)
    assert counting.reads == 0
    assert next(members).id == ids[0] and counting.reads == 1
    assert sum(1 for _ in members) == size - 1 and counting.reads == 10
    assert sum(1 for m in batch_app.batch_results(batch.id) if m.succeeded) == size

    async def read_async() -> list[int]:
        return [m.id async for m in batch_app.batch_results_async(batch.id, page_size=4000)]

    assert asyncio.run(read_async()) == ids


def test_a_page_ends_early_when_its_results_pass_the_byte_bound(make_app, conn):
    app: App = make_app()

    @app.task(name="big.part")
    def part(n: int) -> str:
        return "x" * 400_000

    with app.batch() as batch:
        for n in range(5):
            batch.enqueue("big.part", {"n": n})
    drain(app)
    page = app.batch_results_page(batch.id, limit=10)
    # 400 KB each: the third passes 1 MiB (PAGE_BYTES) only with the fourth.
    assert [m.id for m in page.results] == batch.ids[:3] and page.next_after == batch.ids[2]
    rest = app.batch_results_page(batch.id, after=page.next_after, limit=10)
    assert [m.id for m in rest.results] == batch.ids[3:] and rest.next_after is None
    assert all(len(m.result) == 400_000 for m in page.results + rest.results)


def test_batch_results_of_an_unknown_batch_or_bad_arguments_are_one_line_errors(batch_app):
    with pytest.raises(BatchNotFound, match="no batch 999"):
        batch_app.batch_results_page(999)
    with pytest.raises(BatchNotFound):
        list(batch_app.batch_results(999))
    for kwargs, field in (({"limit": 0}, "limit"), ({"after": -1}, "after")):
        with pytest.raises(ConfigurationError) as caught:
            batch_app.batch_results_page(1, **kwargs)
        assert caught.value.field == field
    with pytest.raises(ConfigurationError):
        batch_app.batch_results(True)
    with batch_app.batch() as empty:
        pass
    assert batch_app.batch_results_page(empty.id) == flow.ResultsPage([], None)
