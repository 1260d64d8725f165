"""A queue's page (its tasks, settings, live workers and newest jobs) and its pause and resume
actions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import quote

import psycopg
from fastapi import Request
from fastapi.responses import Response

from pgjobs import browse, groups, queues
from pgjobs.errors import JobNotFound
from pgjobs.models import JobHistory, JobStatus
from pgjobs.submission import check_name
from pgjobs.web import paths
from pgjobs.web.dashboard import data
from pgjobs.web.dashboard.frame import GET, PAGE_SIZE, POST, Frame, PostedForm, Route
from pgjobs.web.dashboard.security import Viewer

#: How far back a queue's page lists its jobs.
QUEUE_PAGE_WINDOW = timedelta(days=1)


class QueuePages:
    """``/queues/{name}`` and its actions."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def routes(self) -> list[Route]:
        return [
            # A queue's name may hold "/" (sent as %2F, which the server decodes before routing):
            # the name is everything up to the action.
            ("/queues/{name:" + paths.TEXT + "}", self.queue, GET),
            ("/queues/{name:" + paths.TEXT + "}/{action}", self.queue_action, POST),
        ]

    def queue(self, request: Request, name: str) -> Response:
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            check_name("queue", name)
            state = params.get("state") or None
            states = [JobStatus(state)] if state in set(JobStatus) else None
            view = data.queue_view(conn, name)
            jobs, more = _queue_jobs(conn, name, states)
            grouped = groups.load(
                conn,
                limits=self.frame.group_limits,
                ordered=self.frame.ordered_tasks,
                queue=name,
            )
            return self.frame.render(
                request,
                viewer,
                "queue.html",
                page="queues",
                name=name,
                view=view,
                jobs=jobs,
                state=states[0].value if states else "",
                states=list(JobStatus),
                more=more,
                groups=grouped[0] if grouped else None,
            )

        return self.frame.page(request, build)

    def queue_action(
        self, request: Request, name: str, action: str, posted: PostedForm
    ) -> Response:
        """Pause or resume a queue (``pgjobs queue pause/resume``)."""
        back = f"/queues/{quote(name, safe='')}"
        client = request.client.host if request.client else "unknown"

        def act(
            viewer: Viewer, fields: dict[str, str], conn: psycopg.Connection[Any]
        ) -> tuple[str, str]:
            if action == "pause":
                reason = fields.get("reason", "").strip() or None
                change = queues.pause(
                    conn, name, reason=reason, by=viewer.name or f"dashboard ({client})"
                )
                done = "paused" if change.changed else "was already paused"
                return back, f"Queue {name} {done}: its jobs stay ready, no worker claims them."
            if action == "resume":
                change = queues.resume(conn, name)
                done = "resumed" if change.changed else "was not paused"
                return back, f"Queue {name} {done}."
            raise JobNotFound(f"no action {action!r} on queues: use pause or resume")

        return self.frame.act(request, posted, back, act)


_HOT = (JobStatus.READY, JobStatus.SCHEDULED, JobStatus.RUNNING)


def _queue_jobs(
    conn: psycopg.Connection[Any], queue: str, states: list[JobStatus] | None
) -> tuple[list[JobHistory], bool]:
    """A queue's newest jobs in ``states`` (all when None), and whether there are more: every
    queued job, but the archived and dead ones of the last day only. The archive and the dead
    letters have no index by queue, so a queue without recent jobs would have them read whole;
    /jobs?queue= pages on through them."""
    wanted = list(states or JobStatus)
    hot = [s for s in wanted if s in _HOT]
    done = [s for s in wanted if s not in _HOT]
    found: list[JobHistory] = []
    more = False
    if hot:
        page = browse.jobs(conn, states=hot, queue=queue, limit=PAGE_SIZE)
        found += page.jobs
        more |= page.next_cursor is not None
    if done:
        since = data.now(conn) - QUEUE_PAGE_WINDOW
        page = browse.jobs(conn, states=done, queue=queue, since=since, limit=PAGE_SIZE)
        found += page.jobs
        more |= page.next_cursor is not None
    found.sort(key=lambda j: (j.finished_at or j.redriven_at or j.created_at, j.id), reverse=True)
    return found[:PAGE_SIZE], more or len(found) > PAGE_SIZE
