"""Testing an application's tasks: a pytest plugin and helpers (this module is the plugin).

Installing pgjobs registers this module as a pytest plugin (entry point ``pytest11``), which
provides the fixtures:

- ``pgjobs_database``: a migrated throwaway database (a ``pgjobs.db.dsn.Dsn``), every pgjobs table
  empty at the start of each test. The server comes from $PGJOBS_TEST_DSN or $DATABASE_URL, else
  the embedded server (the ``embedded`` extra, in a temporary folder), else a testcontainers
  PostgreSQL (which needs Docker); the database ``pgjobs_test_<random>`` is created once per
  session and dropped at its end.
- ``pgjobs_app``: binds an application's ``App`` to that database for one test
  (``pgjobs_app(app)``), or makes a fresh one (``pgjobs_app()``).

and the helpers, usable with or without the fixtures:

- ``enqueued_jobs(app, task=..., queue=..., payload_subset=...)``: the jobs waiting in
  ``queued_jobs`` (ready, scheduled or running);
- ``assert_enqueued(...)`` / ``assert_not_enqueued(...)``: assertions whose message lists what
  *was* enqueued;
- ``drain(app)``: runs every ready job inline, as a worker would (the same outcome path:
  retries with backoff, dead-lettering, fencing), and returns what happened;
- ``eager(app)``: a context manager under which ``app.enqueue`` runs the handler at once, with
  no database at all.

Their homes: ``database`` (the server, the throwaway database, the fixtures), ``assertions``,
``drain``, ``eager``.

Example::

    from pgjobs.testing import assert_enqueued, drain

    def test_signup_sends_a_welcome_email(pgjobs_app):
        app = pgjobs_app(myapp.jobs.app)
        myapp.signup("ada@example.com")
        assert_enqueued(app, "emails.welcome", {"to": "ada@example.com"})
        assert drain(app).succeeded
"""

from __future__ import annotations

from pgjobs.testing.assertions import (
    SHOWN,
    AppOrDsn,
    assert_enqueued,
    assert_not_enqueued,
    contains,
    enqueued_jobs,
)
from pgjobs.testing.database import (
    ENV_SERVER,
    NO_DATABASE,
    empty_tables,
    pgjobs_app,
    pgjobs_database,
    pgjobs_server_url,
    pgjobs_session_database,
    throwaway_database,
)
from pgjobs.testing.drain import DRAIN_MAX_JOBS, Dead, DrainResult, Retried, drain
from pgjobs.testing.eager import EagerLog, EagerRun, eager

# The fixtures are here too: pytest finds a plugin's fixtures in the module its entry point names.
__all__ = [
    "DRAIN_MAX_JOBS",
    "ENV_SERVER",
    "NO_DATABASE",
    "SHOWN",
    "AppOrDsn",
    "Dead",
    "DrainResult",
    "EagerLog",
    "EagerRun",
    "Retried",
    "assert_enqueued",
    "assert_not_enqueued",
    "contains",
    "drain",
    "eager",
    "empty_tables",
    "enqueued_jobs",
    "pgjobs_app",
    "pgjobs_database",
    "pgjobs_server_url",
    "pgjobs_session_database",
    "throwaway_database",
]
