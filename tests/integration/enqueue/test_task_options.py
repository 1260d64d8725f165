"""Task options as users write them: whole numbers where seconds are floats."""

from __future__ import annotations

from collections.abc import Callable

from pgjobs import App
from tests.support.factories import work
from tests.support.helpers import assert_one_home


def test_whole_number_leases_and_backoff_work_beside_fractional_ones(
    make_app: Callable[..., App], conn
):
    app = make_app()
    ran: list[str] = []

    @app.task(name="whole", lease=30, retry_base=1, retry_cap=60)
    def whole() -> None:
        ran.append("whole")

    @app.task(name="fractional", lease=12.5)
    def fractional() -> None:
        ran.append("fractional")

    ids = [app.enqueue("whole"), app.enqueue("fractional")]
    assert work(app) == 0
    assert sorted(ran) == ["fractional", "whole"]
    assert set(assert_one_home(conn, ids).values()) == {"archived_jobs"}
