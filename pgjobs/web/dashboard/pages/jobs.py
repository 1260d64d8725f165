"""The jobs pages: a listing by state, queue, task and time (or a search by id or idempotency
key), one job's whole record, and its cancel, replay and redrive actions."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import Request
from fastapi.responses import Response

from pgjobs import admin, batches, browse, dependencies, editing
from pgjobs.admin import DeadFilter
from pgjobs.errors import ConfigurationError, JobNotFound
from pgjobs.maintenance.registry import STALE_AFTER
from pgjobs.models import JobStatus
from pgjobs.web.dashboard import data, forms, graph, search
from pgjobs.web.dashboard.frame import GET, PAGE_SIZE, POST, Frame, PostedForm, Route
from pgjobs.web.dashboard.security import Viewer


class JobPages:
    """``/jobs``, ``/jobs/{id}`` and a job's actions."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def routes(self) -> list[Route]:
        return [
            ("/jobs", self.jobs, GET),
            ("/jobs/{job_id}", self.job, GET),
            ("/jobs/{job_id}/{action}", self.job_action, POST),
        ]

    def jobs(self, request: Request) -> Response:
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            find = params.get("find")
            if find:
                return self._search(request, viewer, conn, find, params.get("kind") or "any")
            try:
                query = forms.job_query(params)
                page = browse.jobs(
                    conn,
                    states=query.states,
                    queue=query.queue,
                    task=query.task,
                    since=query.since,
                    until=query.until,
                    tags=query.tags,
                    limit=PAGE_SIZE,
                    cursor=params.get("cursor") or None,
                )
            except ConfigurationError as exc:
                return self.frame.render(
                    request,
                    viewer,
                    "jobs.html",
                    status=422,
                    page="jobs",
                    find="",
                    kind="any",
                    kinds=search.KINDS,
                    search_error=False,
                    found_by={},
                    jobs=[],
                    query=None,
                    raw={k: params.get(k, "") for k in forms.JOB_FIELDS},
                    next_cursor=None,
                    states=list(JobStatus),
                    filter_error=str(exc),
                )
            return self.frame.render(
                request,
                viewer,
                "jobs.html",
                page="jobs",
                find="",
                kind="any",
                kinds=search.KINDS,
                search_error=False,
                found_by={},
                jobs=page.jobs,
                query=query,
                raw={k: query.raw.get(k, "") for k in forms.JOB_FIELDS},
                next_cursor=page.next_cursor,
                states=list(JobStatus),
                filter_error=None,
            )

        return self.frame.page(request, build)

    def _search(
        self,
        request: Request,
        viewer: Viewer,
        conn: psycopg.Connection[Any],
        find: str,
        kind: str,
    ) -> Response:
        """The jobs a search names (``search.find``): one job is shown at once; a search that
        cannot name a job answers 422 with the reason, having read nothing."""
        context: dict[str, Any] = {
            "page": "jobs",
            "query": None,
            "raw": dict.fromkeys(forms.JOB_FIELDS, ""),
            "next_cursor": None,
            "states": list(JobStatus),
            "kinds": search.KINDS,
        }
        try:
            found = search.find(conn, find, kind)
        except ConfigurationError as exc:
            shown = find if len(find) <= search.MAX_BYTES else find[: search.MAX_BYTES] + "…"
            return self.frame.render(
                request,
                viewer,
                "jobs.html",
                status=422,
                find=shown.replace("\x00", ""),
                kind=kind if kind in search.KINDS else "any",
                found_by={},
                jobs=[],
                filter_error=str(exc),
                search_error=True,
                **context,
            )
        if len(found.ids) == 1:
            return self.frame.redirect(request, f"/jobs/{found.ids[0]}")
        return self.frame.render(
            request,
            viewer,
            "jobs.html",
            find=find.strip(),
            kind=kind,
            found_by=found.by,
            jobs=browse.jobs_by_id(conn, found.ids),
            filter_error=None,
            search_error=False,
            **context,
        )

    def job(self, request: Request, job_id: str) -> Response:
        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            number = forms.job_id(job_id)
            if number is None:
                raise JobNotFound(f"{job_id!r} is not a job id")
            found = admin.job(conn, number)
            return self.frame.render(
                request,
                viewer,
                "job.html",
                page="jobs",
                job=found,
                batch_id=batches.batch_of(conn, number),
                graph=dependencies.of(conn, number),
                workflow=graph.workflow(conn, number),
                now=data.now(conn),
                stale_after=STALE_AFTER,
                edits=editing.edits(conn, number),
            )

        return self.frame.page(request, build)

    def job_action(
        self, request: Request, job_id: str, action: str, posted: PostedForm
    ) -> Response:
        number = forms.job_id(job_id)
        back = f"/jobs/{number}" if number is not None else "/jobs"

        def act(
            viewer: Viewer, fields: dict[str, str], conn: psycopg.Connection[Any]
        ) -> tuple[str, str]:
            if number is None:
                raise JobNotFound(f"{job_id!r} is not a job id")
            if action == "edit":
                return _edit(conn, number, fields, viewer, self.frame)
            return _job_action(conn, number, action, fields)

        return self.frame.act(request, posted, back, act)


#: Who an edit on the dashboard is recorded as when the viewer has no name (a token).
DASHBOARD_EDITOR = "dashboard"


def _edit(
    conn: psycopg.Connection[Any],
    job_id: int,
    fields: dict[str, str],
    viewer: Viewer,
    frame: Frame,
) -> tuple[str, str]:
    """The job page's edit form: the fields changed, recorded as the viewer."""
    done = editing.edit(
        conn,
        job_id,
        **forms.job_edit(fields),
        by=viewer.name or DASHBOARD_EDITOR,
        tasks=frame.tasks,
    )
    if done.edit is None:
        return f"/jobs/{job_id}", f"Job {job_id} unchanged: it has these values already."
    return f"/jobs/{job_id}", f"Job {job_id} edited: {', '.join(done.edit.changes)} changed."


def _job_action(
    conn: psycopg.Connection[Any], job_id: int, action: str, fields: dict[str, str]
) -> tuple[str, str]:
    if action == "cancel":
        force = fields.get("force") == "1"
        admin.cancel(conn, job_id, force=force)
        if force:
            return f"/jobs/{job_id}", (
                f"Job {job_id} force-cancelled: archived as cancelled; its handler may still run "
                "to its end, but its outcome is discarded."
            )
        return f"/jobs/{job_id}", f"Job {job_id} cancelled (archived as cancelled, never run)."
    if action == "replay":
        new_id = admin.replay(conn, job_id)
        if admin.job(conn, new_id).status is JobStatus.EXPIRED:
            return f"/jobs/{new_id}", (
                f"Job {job_id} replayed as job {new_id}, archived at once as expired: job "
                f"{job_id} had expired (`pgjobs replay {job_id} --expires-in SECONDS` gives the "
                "copy an expiry of its own)."
            )
        return f"/jobs/{new_id}", f"Job {job_id} replayed as job {new_id}."
    if action == "redrive":
        moved = admin.redrive(conn, DeadFilter(ids=(job_id,)))
        return f"/jobs/{job_id}", f"Job {job_id} redriven ({moved} moved back to the queue)."
    raise JobNotFound(f"no action {action!r} on jobs: use cancel, edit, replay or redrive")
