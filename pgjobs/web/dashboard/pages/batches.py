"""A batch's page: its counts, its callback, and its members by status, each a link to its job."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import Request
from fastapi.responses import Response

from pgjobs import batches
from pgjobs.errors import BatchNotFound
from pgjobs.models import JobStatus
from pgjobs.web.dashboard import forms
from pgjobs.web.dashboard.frame import GET, Frame, Route
from pgjobs.web.dashboard.security import Viewer


class BatchPages:
    """``/batches/{id}``."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def routes(self) -> list[Route]:
        return [("/batches/{batch_id}", self.batch, GET)]

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
                page="jobs",
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
