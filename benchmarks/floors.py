"""The floors under `pgjobs serve`: two servers that do nothing of pgjobs' work, run the way
`pgjobs serve` runs (uvicorn, its h11 protocol, the asyncio loop, no access log), so that the
HTTP API's rows can be read against what its stack allows on the same machine in the same run.

- ``nothing``: a bare ASGI application that reads each request's body and answers 201 with a
  job-sized JSON body. No application served by uvicorn to the same clients on the same cores
  answers faster: its rate is the ceiling of the one-job POST row (group h).
- ``stack``: a FastAPI application with one POST route taking a pydantic model, in a process
  that has imported psycopg and psycopg_pool, as `pgjobs serve` has. Its peak RSS after the same
  200 POSTs is the memory floor of the `pgjobs serve` row (group d): what its libraries cost
  before pgjobs adds anything.

``command(name, port)`` is the command line that serves one of them.
"""

# No ``from __future__ import annotations``: FastAPI reads the route's annotations as objects,
# and the route's model is local to ``_stack``.
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the peers' venv imports this module too, and has no Starlette
    from starlette.types import Receive, Scope, Send

#: The answer of ``nothing``: about the size of a job as the API answers it.
ANSWER = (
    b'{"id":1,"task":"bench.noop","queue":"default","status":"queued","payload":{"n":1},'
    b'"priority":0,"attempts":0,"max_attempts":3,"run_at":"2026-01-01T00:00:00Z"}'
)
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(ANSWER)).encode()),
]


async def nothing(scope: "Scope", receive: "Receive", send: "Send") -> None:
    """ASGI: read the body, answer ``ANSWER`` with 201 (a GET, as the readiness probe sends,
    with 200; the lifespan is acknowledged)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    status = 200 if scope["method"] == "GET" else 201
    await send({"type": "http.response.start", "status": status, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def _stack() -> Any:
    import psycopg  # noqa: F401  (what `pgjobs serve` holds in memory too)
    import psycopg_pool  # noqa: F401
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Job(BaseModel):
        task: str
        payload: dict[str, Any] = {}

    site = FastAPI()

    @site.get("/readyz")
    def ready() -> dict[str, str]:
        return {"status": "ready"}

    @site.post("/api/v1/jobs", status_code=201)
    def enqueue(job: Job) -> Job:
        return job

    return site


def __getattr__(name: str) -> Any:
    # ``stack`` is built on first use, so that serving ``nothing`` imports none of it.
    if name == "stack":
        return _stack()
    raise AttributeError(name)


def command(name: str, port: int) -> list[str]:
    """The command line that serves ``nothing`` or ``stack`` on 127.0.0.1:``port``."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        f"benchmarks.floors:{name}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--http",
        "h11",
        "--loop",
        "asyncio",
        "--log-level",
        "warning",
        "--no-access-log",
    ]
