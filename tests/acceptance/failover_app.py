"""The app of the failover tests: ``pgjobs work --app tests.acceptance.failover_app:app``.

Each run appends one line, ``task key pid``, to the file ``$PGJOBS_FAILOVER_RUNS`` (outside the
database, so that a run is recorded even when the server that would have stored it dies), then
takes a few milliseconds, so that jobs are running when the primary stops.
"""

from __future__ import annotations

import os
import time

import pgjobs

#: The environment variable naming the file of runs.
RUNS_FILE = "PGJOBS_FAILOVER_RUNS"
#: Seconds each handler takes.
RUN_SECONDS = 0.01
#: Seconds a job is leased: longer than the test's outage, so that the outcomes a worker kept
#: through it still count; short, so that a job whose claim committed while its answer was lost
#: with the primary (the worker never saw it) is rescued within the test, not after the default
#: five minutes.
LEASE = 10.0

app = pgjobs.App()  # DSN from $PGJOBS_DATABASE_URL


def _record(task: str, key: int) -> None:
    line = f"{task} {key} {os.getpid()}\n".encode()
    fd = os.open(os.environ[RUNS_FILE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of a short line to an O_APPEND file: never interleaved
    finally:
        os.close(fd)


@app.task(name="failover.many", lease=LEASE)
def many(key: int) -> int:
    """At least once: may run again after a failover."""
    _record("failover.many", key)
    time.sleep(RUN_SECONDS)
    return key


@app.task(name="failover.once", at_most_once=True, lease=LEASE)
def once(key: int) -> int:
    """At most once: dead-lettered, never run again, when its run's fate is unknown."""
    _record("failover.once", key)
    time.sleep(RUN_SECONDS)
    return key
