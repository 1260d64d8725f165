"""The dead-letter pages: groups and jobs by the CLI's filters (and the reason), the count and
confirmation of a bulk redrive or purge, and its progress.

A bulk redrive or purge of more than one batch is the one action that takes time: it runs in the
background (``actions``) and redirects to its progress page, ``/dead/actions/{id}``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from fastapi import Request
from fastapi.responses import Response

from pgjobs import admin, browse
from pgjobs.admin import DeadFilter, DeadSelection
from pgjobs.errors import ConfigurationError, JobStateConflict
from pgjobs.models import DeadReason
from pgjobs.web.dashboard import actions, data, forms, text
from pgjobs.web.dashboard.frame import GET, POST, Frame, PostedForm, Route
from pgjobs.web.dashboard.security import Viewer, security_headers

#: Dead jobs a bulk redrive or purge moves per transaction. A set of more than one batch runs
#: in the background (``actions``), followed by its progress page.
BATCH_SIZE = admin.DEFAULT_BATCH_SIZE
#: Seconds between two reads of a running action's progress by the page's script; without
#: the script, the page reloads itself every ``PROGRESS_RELOAD_SECONDS``.
PROGRESS_SECONDS = 1
PROGRESS_RELOAD_SECONDS = 2


class DeadPages:
    """``/dead`` and its bulk actions; holds the bulk actions running in the background."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        #: The bulk actions of this server (started, running, or ended within the hour).
        self.actions = actions.Actions()

    def routes(self) -> list[Route]:
        return [
            ("/dead", self.dead, GET),
            ("/dead/confirm", self.dead_confirm, GET),
            ("/dead/bulk", self.dead_bulk, POST),
            ("/dead/actions/{action_id}", self.dead_action, GET),
            ("/partials/actions/{action_id}", self.dead_action_partial, GET),
        ]

    def dead(self, request: Request) -> Response:
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            try:
                query = forms.dead_query(params)
                before = _dead_cursor(params.get("before"))
            except ConfigurationError as exc:
                return self.frame.render(
                    request,
                    viewer,
                    "dead.html",
                    status=422,
                    page="dead",
                    query=None,
                    raw={k: params.get(k, "") for k in forms.DEAD_FIELDS},
                    filter_error=str(exc),
                    filter_field=exc.field,
                    view=None,
                    reasons=list(DeadReason),
                )
            view = data.dead_view(
                conn,
                query.where,
                query.reason,
                before=before,
                all_groups=params.get("groups") == "all",
            )
            return self.frame.render(
                request,
                viewer,
                "dead.html",
                page="dead",
                query=query,
                raw={k: query.raw.get(k, "") for k in forms.DEAD_FIELDS},
                filter_error=None,
                filter_field=None,
                view=view,
                reasons=list(DeadReason),
                count_cap=data.COUNT_CAP,
                cursor=browse.encode_cursor(*view.next_cursor) if view.next_cursor else "",
                group_sample=data.GROUP_SAMPLE,
                all_groups=params.get("groups") == "all",
            )

        return self.frame.page(request, build)

    def dead_confirm(self, request: Request) -> Response:
        """What a bulk redrive or purge of the filtered set would move, counted exactly (the
        set is selected now and pinned: the action moves these jobs, not ones that fail
        later), and the form that does it."""
        params = request.query_params

        def build(viewer: Viewer, conn: psycopg.Connection[Any]) -> Response:
            action = params.get("action")
            if action not in ("redrive", "purge"):
                raise ConfigurationError("action must be redrive or purge", field="action")
            query = forms.dead_query(params)
            selection = _select(conn, query.where, query.reason)
            # The form carries the moments as they are now, not "2h": the POST means this set.
            hidden = dict(query.raw)
            for name in ("since", "until"):
                if getattr(query.where, name) is not None:
                    hidden[name] = text.iso(getattr(query.where, name))
            return self.frame.render(
                request,
                viewer,
                "dead_confirm.html",
                page="dead",
                action=action,
                query=query,
                count=selection.count if selection else 0,
                pinned=text.iso(selection.filter.until) if selection else "",
                sample=list(selection.ids[:20]) if selection else [],
                hidden=hidden,
                batch_size=BATCH_SIZE,
            )

        return self.frame.page(request, build)

    def dead_bulk(self, request: Request, posted: PostedForm) -> Response:
        """Redrive or purge the dead jobs matching the posted filters. A purge, and any action
        that names ``expected``, runs only when the set pinned at confirmation still holds
        exactly ``expected`` jobs (else nothing moves and the page says so). A set of one batch
        is moved now; a larger one in the background, and the browser is sent to its progress
        page."""
        fields = posted if isinstance(posted, dict) else {}
        back = "/dead?" + urlencode(
            {k: fields[k] for k in forms.DEAD_FIELDS if fields.get(k, "").strip()}
        )

        def act(
            viewer: Viewer, form: dict[str, str], conn: psycopg.Connection[Any]
        ) -> tuple[str, str]:
            def start(action: str, selection: DeadSelection, query: forms.DeadQuery) -> str:
                return self._start_bulk(viewer, action, selection, query)

            return _bulk(form, conn, start)

        return self.frame.act(request, posted, back, act)

    def _start_bulk(
        self, viewer: Viewer, action: str, selection: DeadSelection, query: forms.DeadQuery
    ) -> str:
        """Start a bulk action in the background; its id."""
        run = admin.redrive_batches if action == "redrive" else admin.purge_batches

        def one_batch(batch: DeadSelection) -> int:
            # A pooled connection for this batch only: requests are not kept waiting for one
            # while a long action runs.
            with self.frame.db() as conn:
                return sum(len(ids) for ids in run(conn, batch, batch_size=len(batch.ids)))

        return self.actions.start(viewer.owner, action, selection, BATCH_SIZE, one_batch, query.raw)

    def dead_action(self, request: Request, action_id: str) -> Response:
        """The progress of a bulk action this session started: batches and jobs done of the
        pinned total, time elapsed, and how it ended. It reads no table (the action reports its
        own progress), so it answers while every pooled connection is busy."""
        viewer = self.frame.viewer(request)
        if isinstance(viewer, Response):
            return viewer
        progress = self.actions.get(action_id, viewer.owner)
        if progress is None:
            return self.frame.error(request, viewer, 404, "Unknown action", _UNKNOWN_ACTION)
        return self.frame.render(
            request,
            viewer,
            "dead_action.html",
            page="dead",
            **_progress_context(request, self.frame.base(request), progress),
        )

    def dead_action_partial(self, request: Request, action_id: str) -> Response:
        """The progress page's live part alone, which its script swaps in."""
        found = self.frame.identify(request)
        if not isinstance(found, Viewer):
            return security_headers(Response("signed out", status_code=401))
        progress = self.actions.get(action_id, found.owner)
        if progress is None:
            return security_headers(Response(_UNKNOWN_ACTION, status_code=404))
        return self.frame.render(
            request,
            found,
            "_action_live.html",
            **_progress_context(request, self.frame.base(request), progress),
        )


def _dead_cursor(value: str | None) -> tuple[browse.CursorTime, int] | None:
    if not value:
        return None
    return browse.decode_cursor(value)


def _select(
    conn: psycopg.Connection[Any], where: DeadFilter, reason: DeadReason | None
) -> DeadSelection | None:
    """The pinned selection of the dead jobs matching; None when none does. With a reason (which
    ``DeadFilter`` has not), the matching ids are selected first and pinned by id."""
    if reason is not None:
        ids = data.dead_ids(conn, where, reason)
        if not ids:
            return None
        selection = admin.select_dead(conn, replace(where, ids=tuple(sorted(ids))))
    else:
        selection = admin.select_dead(conn, where)
    return selection if selection.count else None


_UNKNOWN_ACTION = (
    "Unknown action: no bulk action with this id is known to this server. Its page lasts an "
    "hour after it ends, lives in the server's memory (a restart forgets it), and is shown only "
    "to the session that started it."
)


def _progress_context(request: Request, base: str, progress: actions.Progress) -> dict[str, Any]:
    return {
        "progress": progress,
        "committed": actions.committed(progress),
        "back": "/dead?" + urlencode(progress.filters),
        "partial_url": f"{base}/partials/actions/{quote(progress.id, safe='')}",
        "progress_seconds": PROGRESS_SECONDS,
        "reload_seconds": PROGRESS_RELOAD_SECONDS,
    }


def _bulk(
    fields: dict[str, str],
    conn: psycopg.Connection[Any],
    start: Callable[[str, DeadSelection, forms.DeadQuery], str],
) -> tuple[str, str]:
    action = fields.get("action")
    if action not in ("redrive", "purge"):
        raise ConfigurationError("action must be redrive or purge", field="action")
    query = forms.dead_query(fields)
    pinned = forms.moment("pinned", fields.get("pinned") or None)
    where = query.where if pinned is None else replace(query.where, until=_earlier(query, pinned))
    expected_text = fields.get("expected", "").strip()
    if action == "purge" and not expected_text:
        # A purge is confirmed on the page that counts what it deletes.
        return "/dead/confirm?" + query.query_string(action="purge"), "Confirm the purge first."
    selection = _select(conn, where, query.reason)
    count = selection.count if selection else 0
    back = "/dead?" + query.query_string()
    if expected_text and (not expected_text.isdigit() or int(expected_text) != count):
        raise JobStateConflict(
            f"the set changed since it was counted: {count:,} dead jobs match now, not "
            f"{expected_text}; nothing was {action}d. Review and confirm again."
        )
    if selection is None:
        return back, f"No dead job matches: nothing to {action}."
    size = BATCH_SIZE
    if count > size:
        action_id = start(action, selection, query)
        batches = -(-count // size)
        doing = "Redriving" if action == "redrive" else "Purging"
        return f"/dead/actions/{action_id}", (
            f"{doing} {count:,} dead jobs in {batches} batches of up to {size:,}, in the "
            "background: this page follows it (leaving it does not stop it)."
        )
    run = admin.redrive_batches if action == "redrive" else admin.purge_batches
    moved = batches = 0
    for ids in run(conn, selection, batch_size=size):
        moved += len(ids)
        batches += 1
    verb = "Redrove" if action == "redrive" else "Purged"
    message = (
        f"{verb} {moved:,} of {count:,} dead jobs in {batches} batch{'es' if batches != 1 else ''}"
        f" of up to {size:,}"
    )
    if moved < count:
        message += f"; {count - moved:,} had already left dead_letter (another redrive or purge)"
    return back, message + "."


def _earlier(query: forms.DeadQuery, pinned: datetime) -> datetime:
    until = query.where.until
    return pinned if until is None else min(until, pinned)
