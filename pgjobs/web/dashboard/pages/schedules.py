"""The schedules page: every periodic schedule in the database (next and last run, whether a
worker declares it, whether it is paused), and its pause and resume actions."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import Request
from fastapi.responses import Response

from pgjobs import schedules
from pgjobs import stats as read_model
from pgjobs.errors import JobNotFound
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.web import paths
from pgjobs.web.dashboard import data
from pgjobs.web.dashboard.frame import GET, POST, Frame, PostedForm, Route
from pgjobs.web.dashboard.security import Viewer


class SchedulePages:
    """``/schedules`` and a schedule's actions."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def routes(self) -> list[Route]:
        return [
            ("/schedules", self.schedules, GET),
            # A schedule's name may hold "/": the name is everything up to the action.
            ("/schedules/{name:" + paths.TEXT + "}/{action}", self.schedule_action, POST),
        ]

    def schedules(self, request: Request) -> Response:
        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            return self.frame.render(
                request,
                viewer,
                "schedules.html",
                page="schedules",
                schedules=read_model.schedules(conn),
                now=data.now(conn),
                stale_after=STALE_AFTER,
            )

        return self.frame.page(request, build)

    def schedule_action(
        self, request: Request, name: str, action: str, posted: PostedForm
    ) -> Response:
        """Pause or resume a schedule (``pgjobs schedule pause/resume``)."""
        back = "/schedules"
        client = request.client.host if request.client else "unknown"

        def act(
            viewer: Viewer, fields: dict[str, str], conn: psycopg.Connection[Any]
        ) -> tuple[str, str]:
            if action == "pause":
                reason = fields.get("reason", "").strip() or None
                change = schedules.pause(
                    conn, name, reason=reason, by=viewer.name or f"dashboard ({client})"
                )
                done = "paused" if change.changed else "was already paused"
                return back, f"Schedule {name} {done}: none of its occurrences is enqueued."
            if action == "resume":
                change = schedules.resume(conn, name)
                done = "resumed" if change.changed else "was not paused"
                return back, (
                    f"Schedule {name} {done}; occurrences missed while paused run as its "
                    f"catch_up rule ({change.schedule.catch_up}) says."
                )
            raise JobNotFound(f"no action {action!r} on schedules: use pause or resume")

        return self.frame.act(request, posted, back, act)
