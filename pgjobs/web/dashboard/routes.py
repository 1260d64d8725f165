"""The dashboard's route table: the frame, its page groups (``pages``), the static assets, and
the lifespan that stops the running bulk actions when the server stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse

from pgjobs.tasks import Task
from pgjobs.web.auth import Tokens
from pgjobs.web.dashboard.frame import GET, ConnectionSource, Frame, Route
from pgjobs.web.dashboard.pages.batches import BatchPages
from pgjobs.web.dashboard.pages.dead import DeadPages
from pgjobs.web.dashboard.pages.jobs import JobPages
from pgjobs.web.dashboard.pages.login import LoginPages
from pgjobs.web.dashboard.pages.overview import OverviewPages
from pgjobs.web.dashboard.pages.queues import QueuePages
from pgjobs.web.dashboard.pages.schedules import SchedulePages
from pgjobs.web.dashboard.sessions import Sessions
from pgjobs.web.throttle import SignInThrottle

#: Seconds a stopping server waits for running bulk actions to end their batch in flight.
SHUTDOWN_WAIT = 10.0


class Dashboard:
    """The dashboard of one server: its frame (where it reads, who may look, its templates) and
    its pages."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        self.dead = DeadPages(self.frame)
        self.pages = (
            OverviewPages(self.frame),
            self.dead,
            JobPages(self.frame),
            BatchPages(self.frame),
            QueuePages(self.frame),
            SchedulePages(self.frame),
            LoginPages(self.frame),
        )

    def router(self) -> APIRouter:
        """The dashboard's routes; every one is left out of the API's OpenAPI document."""
        router = APIRouter(include_in_schema=False, lifespan=self._lifespan)
        routes: list[Route] = [route for pages in self.pages for route in pages.routes()]
        routes.append(("/static/{name}", self.frame.static, GET))
        for path, endpoint, methods in routes:
            router.add_api_route(path, endpoint, methods=methods, response_class=HTMLResponse)
        return router

    @asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        """Bulk actions run while the server serves; a stopping server starts no more batches
        and gives the batches in flight ``SHUTDOWN_WAIT`` seconds to commit (each batch is one
        transaction: one that does not end in time is rolled back when the process exits)."""
        self.dead.actions.resume()
        try:
            yield
        finally:
            await asyncio.to_thread(self.dead.actions.stop, SHUTDOWN_WAIT)


def dashboard_router(
    connection: ConnectionSource,
    *,
    reading: ConnectionSource | None = None,
    tokens: Tokens,
    insecure_no_auth: bool = False,
    sessions: Sessions | None = None,
    throttle: SignInThrottle | None = None,
    group_limits: Mapping[str, int] | None = None,
    ordered_tasks: Mapping[str, bool | str] | None = None,
    hosted: bool = False,
    sign_in_url: str | None = None,
    tasks: Mapping[str, Task] | None = None,
) -> APIRouter:
    """The dashboard's routes for ``create_app`` to include: pages at ``/``, ``/dead``,
    ``/dead/actions/{id}`` (a bulk action's progress), ``/jobs``, ``/batches/{id}``,
    ``/queues/{name}``, ``/schedules``, ``/login``, assets under ``/static``. Its lifespan
    (merged into the app's by ``include_router``) stops the running bulk actions when the
    server stops. ``sessions`` and ``throttle``: the server's, when it shares them (new ones
    otherwise). ``reading``: where
    the pages read, a standby (``pgjobs serve --read-dsn``), whose lag each page then shows;
    the actions still use ``connection``. ``group_limits``: the app's tasks' own group limits
    (``groups.task_limits``), for the groups at their limit a queue's page shows;
    ``ordered_tasks`` (``groups.ordered_tasks``), for what holds their groups. ``hosted``: the
    application that mounts it signs browsers in (``pgjobs.web.hosted``), and sends those it
    did not to ``sign_in_url`` (a 401 page without one). ``tasks``: the app's, which check a
    payload edited on a job's page.

    Example::

        api.include_router(dashboard_router(lambda: db.pooled(pool, dsn), tokens=tokens))
    """
    frame = Frame(
        connection,
        reading=reading,
        tokens=tokens,
        insecure_no_auth=insecure_no_auth,
        sessions=sessions,
        throttle=throttle,
        group_limits=group_limits,
        ordered_tasks=ordered_tasks,
        hosted=hosted,
        sign_in_url=sign_in_url,
        tasks=tasks,
    )
    return Dashboard(frame).router()
