"""`pgjobs work --processes N`: one command that runs N worker processes and looks after them.

One worker process is one asyncio loop, so it uses one CPU core at most. The command forks its N
worker processes at once, first thing, before it imports your app or resolves the database:
each is then a copy of a process that has imported pgjobs and nothing of yours, holds no
connection, no thread and no event loop (a forked connection or loop is not safe to use; a
process with a thread is not forked, its worker processes start as below). Each worker process
imports your app itself, so N start about as fast as one. The supervisor then imports the app
too, resolves the database once (the embedded server is started once for all) and hands it to
each of them. A worker process that replaces one that died starts as a fresh interpreter
running ``python -m pgjobs work ...`` with the same options, working directory and environment:
the supervisor has imported your app by then, and a fork would copy what your app started at
import (threads, connections). The supervisor never connects to the database itself; every
worker process registers in ``pgjobs_workers`` as a single worker does.

A worker process and its supervisor share a socket pair (for a fresh interpreter, the hidden
``--supervisor-fd`` option):

- the supervisor sends the database first (``dsn [url, source]``, never on a command line, where
  a password would show in `ps`); a worker process whose supervisor went away before that
  exits at once, quietly: it had started nothing, and the supervisor reports its own error;
- the worker process writes ``ready`` once its start-up checks passed (app imported, database
  reached, schema current), or ``failed CODE MESSAGE`` when they failed, instead of printing the
  error itself (N processes would print it N times). A failed start before any worker process
  was ready means that the configuration is wrong: the supervisor stops the others and raises
  that error, so the command prints it once and exits with its code (2 for a bad
  configuration, 1 for the others); a worker process that exits with 1 or 2 before it was ready
  without saying why ends it all alike. After one was ready, a failed start is logged with its
  reason and replaced like any other exit;
- the supervisor's end closes when the supervisor exits, even by kill -9: the worker process then
  stops itself as on SIGTERM, so that no worker runs on unsupervised.

Each worker process also learns its slot, 0..N-1 (a fresh interpreter from
``PGJOBS_SUPERVISOR_SLOT``; a replacement takes the slot of the process it replaces): with
`--http HOST:PORT`, worker process i listens on PORT+i.

The parts: ``forking`` (the first fork, and ending a process), ``loop`` (``Supervisor``), ``link``
(a worker process's side), ``protocol`` (what the two say).
"""

from __future__ import annotations

from pgjobs.supervisor.forking import (
    ABANDON_WAIT,
    Forked,
    ForkedProcess,
    abandon,
    fork_workers,
    leave,
)
from pgjobs.supervisor.link import SupervisorLink
from pgjobs.supervisor.loop import (
    FIRST_RESTART_DELAY,
    MAX_PROCESSES,
    MAX_RESTART_DELAY,
    STABLE_AFTER,
    START_ERROR_CODES,
    Supervisor,
    exit_code,
    restart_delay,
)
from pgjobs.supervisor.protocol import SLOT_ENV

__all__ = [
    "ABANDON_WAIT",
    "FIRST_RESTART_DELAY",
    "MAX_PROCESSES",
    "MAX_RESTART_DELAY",
    "SLOT_ENV",
    "STABLE_AFTER",
    "START_ERROR_CODES",
    "Forked",
    "ForkedProcess",
    "Supervisor",
    "SupervisorLink",
    "abandon",
    "exit_code",
    "fork_workers",
    "leave",
    "restart_delay",
]
