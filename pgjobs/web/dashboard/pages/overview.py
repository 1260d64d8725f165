"""The overview page: `pgjobs stats` in a browser, the last hour by minute, and the tables'
sizes; its live part refreshes every ``REFRESH_SECONDS``."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import Request
from fastapi.responses import Response

from pgjobs.web.dashboard import data
from pgjobs.web.dashboard.frame import GET, Frame, Route
from pgjobs.web.dashboard.security import Viewer, security_headers


class OverviewPages:
    """The overview (``/``) and its live part."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def routes(self) -> list[Route]:
        return [
            ("/", self.overview, GET),
            ("/partials/overview", self.overview_partial, GET),
        ]

    def overview(self, request: Request) -> Response:
        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            view = data.overview(conn)
            return self.frame.render(
                request, viewer, "overview.html", page="overview", **_live(view)
            )

        return self.frame.page(request, build)

    def overview_partial(self, request: Request) -> Response:
        """The overview's live part alone, which the page's script swaps in."""
        found = self.frame.identify(request)
        if not isinstance(found, Viewer):
            return security_headers(Response("signed out", status_code=401))

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            view = data.overview(conn)
            return self.frame.render(request, viewer, "_overview_live.html", **_live(view))

        return self.frame.page(request, build)


def _live(view: data.Overview) -> dict[str, Any]:
    """The overview's live part: queues (those no live worker serves marked), chart, workers,
    orphaned leases, table sizes."""
    peak = max([max(p.finished, p.failed) for p in view.chart] + [1])
    return {
        "view": view,
        "queues": view.snapshot.queues,
        "workers": view.snapshot.workers,
        "orphaned": view.snapshot.orphaned,
        "chart": view.chart,
        "peak": peak,
        "totals": {
            "finished": sum(p.finished for p in view.chart),
            "failed": sum(p.failed for p in view.chart),
        },
        "sizes": view.sizes,
        "exact_cap": data.EXACT_COUNT_CAP,
        "unserved": set(view.snapshot.unserved),
        "now": view.now,
    }
