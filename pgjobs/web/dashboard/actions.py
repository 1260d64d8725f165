"""Bulk redrives and purges that run in the background of the server, and their progress.

A bulk action of more than one batch would keep the browser waiting for as long as it runs (a
100k-job purge, a minute or more); the dashboard runs it in a thread of the server process
instead and sends the browser to a page that follows it. The jobs are the ones selected and
pinned when the action was asked for (``admin.select_dead``); each batch is one transaction of
``admin.redrive_batches`` / ``admin.purge_batches``, on a pooled connection taken for that batch
only, so:

- an error stops the action after the batches already committed, which stay committed, and the
  page says how many;
- a server that stops mid-action stops it at the end of the batch in flight (or, if the process
  ends first, that batch's transaction is rolled back by PostgreSQL): every job is in exactly one
  table either way;
- two actions over overlapping sets are safe: the batch statements take their rows with
  ``FOR UPDATE SKIP LOCKED`` and only rows still in dead_letter, so each job moves once.

The registry lives in the server process: bounded (``KEEP_FINISHED`` finished actions, each kept
``EXPIRE_SECONDS`` after it ended; at most ``MAX_RUNNING`` running at once), keyed by an
unguessable id, and each action is visible only to the credential that started it (the same API
token, through a session cookie or a bearer header; with ``--insecure-no-auth``, the browser that
started it). After a restart every id is unknown.
"""

from __future__ import annotations

import enum
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pgjobs.admin import DeadSelection
from pgjobs.errors import PgjobsError

logger = logging.getLogger("pgjobs.web.dashboard")

#: Finished actions kept in memory (the oldest go first beyond it).
KEEP_FINISHED = 50
#: Seconds a finished action's page stays available.
EXPIRE_SECONDS = 3600
#: Actions that may run at once (each holds one pooled connection while a batch runs).
MAX_RUNNING = 4


class TooManyActions(PgjobsError):
    """No bulk action was started: ``MAX_RUNNING`` run already, the server is stopping, or the
    process could not start a thread."""


class State(enum.StrEnum):
    RUNNING = "running"
    #: Every batch ran.
    FINISHED = "finished"
    #: A batch failed; the ones before it stay committed.
    FAILED = "failed"
    #: The server stopped before every batch ran.
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class Progress:
    """What a progress page shows of one action, as it was when it was read."""

    id: str
    #: "redrive" or "purge".
    action: str
    #: The filters it was asked with, as posted (for the page to show them).
    filters: tuple[tuple[str, str], ...]
    #: The pinned selection's size, and in how many batches of up to ``batch_size``.
    count: int
    batches: int
    batch_size: int
    started_at: datetime
    state: State = State.RUNNING
    batches_done: int = 0
    #: Jobs moved (redriven or purged) by the committed batches.
    moved: int = 0
    elapsed: float = 0.0
    #: What the action did, once it ended (the message a small action's redirect shows).
    message: str = ""
    #: Why it stopped, when it failed or the server stopped.
    error: str = ""

    @property
    def running(self) -> bool:
        return self.state is State.RUNNING

    @property
    def percent(self) -> int:
        return 100 if not self.count else min(100, self.moved * 100 // self.count)


#: Runs one batch (a selection of up to one batch of ids) in one transaction; returns how many
#: jobs it moved.
BatchRunner = Callable[[DeadSelection], int]


@dataclass(slots=True)
class _Entry:
    progress: Progress
    owner: bytes
    started: float
    ended: float | None = None
    thread: threading.Thread | None = field(default=None, repr=False)
    #: Set when the server stops: no further batch starts (a later start of the server does
    #: not clear it, so an action stopped stays stopped).
    stop: threading.Event = field(default_factory=threading.Event, repr=False)


class Actions:
    """The registry of one server's bulk actions.

    Example::

        actions = Actions()
        action_id = actions.start(viewer.owner, "purge", selection, 1000, run_one, filters)
        actions.get(action_id, viewer.owner)  # Progress, or None for anyone else
    """

    def __init__(
        self,
        *,
        keep: int = KEEP_FINISHED,
        expire_seconds: float = EXPIRE_SECONDS,
        max_running: int = MAX_RUNNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keep = keep
        self._expire = expire_seconds
        self._max_running = max_running
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._stopping = threading.Event()

    def start(
        self,
        owner: bytes,
        action: str,
        selection: DeadSelection,
        batch_size: int,
        run: BatchRunner,
        filters: dict[str, str],
    ) -> str:
        """Run ``run`` over ``selection`` batch by batch in a thread of its own; returns the
        action's id. ``TooManyActions`` (nothing started) when ``MAX_RUNNING`` run already or
        the server is stopping."""
        action_id = secrets.token_urlsafe(18)
        progress = Progress(
            id=action_id,
            action=action,
            filters=tuple(sorted(filters.items())),
            count=selection.count,
            batches=-(-selection.count // batch_size),
            batch_size=batch_size,
            started_at=datetime.now(UTC),
        )
        with self._lock:
            self._expire_old()
            if self._stopping.is_set():
                raise TooManyActions("the server is stopping: nothing was started")
            running = sum(1 for e in self._entries.values() if e.ended is None)
            if running >= self._max_running:
                raise TooManyActions(
                    f"{running} bulk actions are running already (at most {self._max_running}):"
                    " wait for one to finish; nothing was started"
                )
            entry = _Entry(progress, owner, self._clock())
            self._entries[action_id] = entry
            # A daemon thread: a process that ends mid-batch has PostgreSQL roll that batch back.
            entry.thread = threading.Thread(
                target=self._run,
                args=(entry, selection, batch_size, run),
                name=f"pgjobs-dashboard-{action}",
                daemon=True,
            )
            try:
                entry.thread.start()
            except RuntimeError as exc:  # the process may start no more threads
                del self._entries[action_id]
                raise TooManyActions(
                    f"cannot start the action ({exc}); nothing was started"
                ) from exc
        return action_id

    def get(self, action_id: str, owner: bytes) -> Progress | None:
        """The progress of ``action_id``; None when there is no such action, it expired, or
        ``owner`` did not start it (all three look the same to the asker)."""
        with self._lock:
            self._expire_old()
            entry = self._entries.get(action_id)
            if entry is None or not hmac.compare_digest(entry.owner, owner):
                return None
            end = entry.ended if entry.ended is not None else self._clock()
            return replace(entry.progress, elapsed=max(0.0, end - entry.started))

    def resume(self) -> None:
        """Accept new actions again (the server started)."""
        self._stopping.clear()

    def stop(self, wait: float) -> None:
        """The server is stopping: no batch starts from now on, and the running actions are
        given up to ``wait`` seconds to end the batch in flight."""
        with self._lock:
            self._stopping.set()
            running = [e for e in self._entries.values() if e.ended is None]
            for entry in running:
                entry.stop.set()
            threads = [e.thread for e in running if e.thread is not None]
        deadline = time.monotonic() + wait
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- inside ----------------------------------------------------------------------------------

    def _set(self, entry: _Entry, progress: Progress) -> None:
        with self._lock:
            entry.progress = progress
            if not progress.running:
                entry.ended = self._clock()

    def _run(
        self, entry: _Entry, selection: DeadSelection, batch_size: int, run: BatchRunner
    ) -> None:
        progress = entry.progress
        ids = selection.ids
        for start in range(0, len(ids), batch_size):
            if entry.stop.is_set():
                stopped = replace(progress, state=State.STOPPED, error=_stopped(progress))
                self._set(entry, stopped)
                return
            try:
                moved = run(replace(selection, ids=ids[start : start + batch_size]))
            except Exception as exc:
                if isinstance(exc, PgjobsError):
                    error = str(exc)
                else:
                    logger.exception("dashboard bulk %s failed", progress.action)
                    error = "the batch failed; the server logged why"
                self._set(entry, replace(progress, state=State.FAILED, error=error))
                return
            progress = replace(
                progress, batches_done=progress.batches_done + 1, moved=progress.moved + moved
            )
            self._set(entry, progress)
        self._set(entry, replace(progress, state=State.FINISHED, message=summary(progress)))

    def _expire_old(self) -> None:
        """Forget finished actions older than ``expire_seconds``, and beyond ``keep`` the
        oldest finished ones (running actions are never forgotten)."""
        now = self._clock()
        ended = sorted(
            ((e.ended, key) for key, e in self._entries.items() if e.ended is not None),
            reverse=True,
        )
        for rank, (at, key) in enumerate(ended):
            if rank >= self._keep or now - at > self._expire:
                del self._entries[key]


def _verb(action: str) -> str:
    return "redriven" if action == "redrive" else "purged"


def summary(progress: Progress) -> str:
    """What a finished action did, in the words of a small action's message."""
    verb = "Redrove" if progress.action == "redrive" else "Purged"
    batches = progress.batches_done
    text = (
        f"{verb} {progress.moved:,} of {progress.count:,} dead jobs in {batches} "
        f"batch{'es' if batches != 1 else ''} of up to {progress.batch_size:,}"
    )
    if progress.moved < progress.count:
        text += (
            f"; {progress.count - progress.moved:,} were not: they had left dead_letter, or "
            "another redrive or purge held them at that moment (skipped, not waited for)"
        )
    return text + "."


def _stopped(progress: Progress) -> str:
    return (
        f"The server stopped before the action ended: {progress.batches_done} of "
        f"{progress.batches} batches ({progress.moved:,} jobs) were committed and stay "
        f"{_verb(progress.action)}; the others are still in dead_letter."
    )


def committed(progress: Progress) -> str:
    """What a failed action had done before it stopped."""
    left = progress.count - progress.moved
    return (
        f"{progress.batches_done} of {progress.batches} batches ({progress.moved:,} jobs) were "
        f"committed before it and stay {_verb(progress.action)}; nothing else was changed "
        f"(up to {left:,} jobs are still in dead_letter)."
    )
