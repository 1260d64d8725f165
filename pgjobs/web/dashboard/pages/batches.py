"""The batches: a list of them, newest first, a page at a time (a keyset on the id, never an
OFFSET), and a batch's page: its counts, its callback, and its members by status, each a link to
its job."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import Request
from fastapi.responses import Response

from pgjobs import batches, db, queries
from pgjobs.batches import BatchStatus
from pgjobs.errors import BatchNotFound, ConfigurationError
from pgjobs.models import JobStatus
from pgjobs.web.dashboard import forms
from pgjobs.web.dashboard.frame import GET, PAGE_SIZE, Frame, Route
from pgjobs.web.dashboard.security import Viewer

#: BATCHES_PAGE's columns: BatchStatus's but its members' counts.
_COLUMNS = tuple(BatchStatus.__dataclass_fields__)[:-1]


class BatchPages:
    """``/batches`` and ``/batches/{id}``."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def routes(self) -> list[Route]:
        return [("/batches", self.batches, GET), ("/batches/{batch_id}", self.batch, GET)]

    def batches(self, request: Request) -> Response:
        raw = request.query_params.get("before")

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            before = None
            if raw:
                before = forms.job_id(raw)
                if before is None:
                    raise ConfigurationError(
                        f"before= is the id of the last batch of the page before, got {raw[:40]!r}"
                    )
            shown, older = page(conn, before)
            return self.frame.render(
                request,
                viewer,
                "batches.html",
                page="batches",
                batches=shown,
                before=before,
                older=older,
            )

        return self.frame.page(request, build)

    def batch(self, request: Request, batch_id: str) -> Response:
        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            number = forms.job_id(batch_id)  # ids of one form: 1..2**63-1, "#" allowed
            if number is None:
                raise BatchNotFound(f"{batch_id!r} is not a batch id")
            status = batches.status(conn, number)
            members = batches.members(conn, number)
            return self.frame.render(
                request,
                viewer,
                "batch.html",
                page="batches",
                batch=status,
                # Statuses in JobStatus's order, those with members only.
                members=[
                    (s.value, status.members[s.value], members.get(s.value, []))
                    for s in JobStatus
                    if status.members.get(s.value)
                ],
                shown=batches.MEMBERS_SHOWN,
            )

        return self.frame.page(request, build)


def page(
    conn: psycopg.Connection[Any], before: int | None, limit: int = PAGE_SIZE
) -> tuple[list[BatchStatus], int | None]:
    """Up to ``limit`` batches older than batch ``before`` (from the newest when None), newest
    first, and the cursor of the next page (None: no older batch). Their members are not counted
    (the batch's page does): the counts are the batch row's."""
    rows = db.fetch_all(conn, queries.BATCHES_PAGE, {"before": before, "limit": limit + 1})
    shown = [
        BatchStatus(**dict(zip(_COLUMNS, row, strict=True)), members={}) for row in rows[:limit]
    ]
    return shown, shown[-1].id if len(rows) > limit else None
