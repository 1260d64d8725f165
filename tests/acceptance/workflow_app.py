"""The app of the durable-workflow acceptance tests (`pgjobs work --app
tests.acceptance.workflow_app:app`): a checkout workflow of three steps and a sleep that counts
every run of every step and every write in side tables of its own (``WORKFLOW_DDL``), and kills
its own worker with SIGKILL once at the boundary a job's payload names (``die_at``)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import psycopg

import pgjobs

#: The side tables: a row per run of a step (``wf_runs``, written at once on a connection of
#: its own), per write of a step (``wf_effects``: the transactional steps' in their transaction),
#: per kill (``wf_deaths``: each boundary kills once).
WORKFLOW_DDL = """
DROP TABLE IF EXISTS wf_runs, wf_effects, wf_deaths;
CREATE TABLE wf_runs (key bigint NOT NULL, step text NOT NULL, worker_pid int NOT NULL);
CREATE TABLE wf_effects (key bigint NOT NULL, step text NOT NULL);
CREATE TABLE wf_deaths (key bigint NOT NULL, point text NOT NULL, PRIMARY KEY (key, point));
"""

#: Every boundary a job may die at: in each step before and after its write (after the write
#: and before the step's record, for the transactional steps still inside their transaction),
#: between the second step's record and the sleep, after the last record.
POINTS = (
    "charge:start",
    "charge:end",
    "reserve:start",
    "reserve:end",
    "sleep:before",
    "email:start",
    "email:end",
    "end",
)

#: Seconds a workflow job is leased: short, so that a killed run is taken over quickly.
LEASE = 3.0

app = pgjobs.App()
_local = threading.local()

#: Steps that ride out the sessions a test ends under them (pg_terminate_backend).
STEADY = pgjobs.step_policy(attempts=20, retry=pgjobs.RetryPolicy(base=0.05, cap=0.5))


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(app.dsn.url, autocommit=True, application_name="pgjobs-wf-side")
        _local.conn = conn
    return conn


def _ran(key: int, step: str) -> None:
    _conn().execute("INSERT INTO wf_runs VALUES (%s, %s, %s)", [key, step, os.getpid()])


def _boundary(key: int, point: str, die_at: str | None) -> None:
    """SIGKILL this worker the first time ``key`` reaches ``die_at``."""
    if point != die_at:
        return
    first = (
        _conn()
        .execute(
            "INSERT INTO wf_deaths VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1", [key, point]
        )
        .fetchall()
    )
    if first:
        os.kill(os.getpid(), signal.SIGKILL)


@app.workflow(name="accept.checkout", lease=LEASE, max_attempts=25, retry_base=0.1, retry_cap=1)
def checkout(ctx: pgjobs.WorkflowContext, key: int, die_at: str | None = None) -> dict[str, Any]:
    @STEADY
    def charge() -> int:
        _ran(key, "charge")
        _boundary(key, "charge:start", die_at)
        ctx.transaction().execute("INSERT INTO wf_effects VALUES (%s, 'charge')", [key])
        _boundary(key, "charge:end", die_at)
        return 100 + key

    @STEADY
    def reserve() -> str:
        _ran(key, "reserve")
        _boundary(key, "reserve:start", die_at)
        _conn().execute("INSERT INTO wf_effects VALUES (%s, 'reserve')", [key])
        _boundary(key, "reserve:end", die_at)
        return "reserved"

    @STEADY
    def email() -> None:
        _ran(key, "email")
        _boundary(key, "email:start", die_at)
        ctx.transaction().execute("INSERT INTO wf_effects VALUES (%s, 'email')", [key])
        _boundary(key, "email:end", die_at)

    cents = ctx.step("charge", charge)
    reserved = ctx.step("reserve", reserve)
    _boundary(key, "sleep:before", die_at)
    ctx.sleep(0.2)
    ctx.step("email", email)
    _boundary(key, "end", die_at)
    return {"key": key, "cents": cents, "reserved": reserved}
