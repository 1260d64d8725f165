"""The express lane of ``POST /api/v1/jobs``: a plain job (``enqueue.fits``) sent with a full
token is enqueued and answered here, before FastAPI routes the request; anything else goes on to
the route, which answers it as it always did (errors included).

Why: a one-job POST is the request a producer sends most, and FastAPI's routing, dependencies,
body handling and response checks took about 60% of the server's CPU for it, more than the
enqueue itself. Here the body is validated by the route's own model (``models.JobCreate``),
checked by ``App.prepare`` (its handler's signature too, as the route checks it), inserted with
the other requests' jobs (``Enqueuer``), and answered with the bytes the route would send: the
same model, dumped as FastAPI dumps a response.

It sits behind ``Guards``, which has checked the token, the body's size and type, and read it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgjobs import enqueue
from pgjobs.errors import PgjobsError
from pgjobs.web import models
from pgjobs.web.auth import Access
from pgjobs.web.backend import ACCESS_STATE, API_PREFIX, Backend
from pgjobs.web.errors import pgjobs_error_response
from pgjobs.web.paths import route_path

#: The route this lane serves.
PATH = API_PREFIX + "/jobs"


class ExpressEnqueue:
    """ASGI middleware: serves plain one-job enqueues (see the module), passes on the rest."""

    def __init__(self, app: ASGIApp, backend: Backend) -> None:
        self.app = app
        self.backend = backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope.get("state", {}).get(ACCESS_STATE) is not Access.FULL
            or route_path(scope) != PATH
        ):
            await self.app(scope, receive, send)
            return
        # Guards read the body: it comes as one message.
        message = await receive()
        answer = await self._enqueue(message)
        if answer is None:
            await self.app(scope, _again(message, receive), send)
            return
        await answer(scope, receive, send)

    async def _enqueue(self, message: Message) -> Response | None:
        """The answer, or None for a request the route must answer."""
        if message["type"] != "http.request" or message.get("more_body", False):
            return None
        try:
            body = models.JobCreate.model_validate(json.loads(message.get("body", b"")))
            if not _plain(body):
                return None
            row = self.backend.app.prepare(body.spec(body.idempotency_key), complete=True)
        except Exception:  # the route finds the same fault and says it in its own words
            return None
        if not enqueue.fits(row):  # made so by its task's declaration
            return None
        try:
            inserted = await self.backend.enqueuer.insert(row)
        except PgjobsError as exc:
            return pgjobs_error_response(exc)
        # A job just enqueued has no dependencies nor dependents, and no edits.
        job = models.Job.model_validate(inserted).model_copy(
            update={"after": [], "dependents": [], "edits": [], "workflow": []}
        )
        return Response(dump(job), status_code=201, media_type="application/json")


def _plain(body: models.JobCreate) -> bool:
    """Whether the request asks for nothing that keeps its job from sharing a statement with
    others (``enqueue.fits``): checked before the job is, so that the route checks such a
    job once."""
    return (
        body.idempotency_key is None
        and body.group is None
        and body.unique_key is None
        and body.after is None
    )


def dump(job: models.Job) -> bytes:
    """``job`` as FastAPI answers a route's ``response_model``: dumped in JSON mode by alias,
    encoded as Starlette's ``JSONResponse`` encodes."""
    content: Any = job.model_dump(mode="json", by_alias=True)
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


def _again(message: Message, receive: Receive) -> Receive:
    """A ``receive`` that gives ``message`` once more, then waits on ``receive``."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return message
        return await receive()

    return again
