"""The dashboard's sessions: a random id in the browser's cookie, everything else in the
server's memory.

Signing in with an API token starts a session; the browser gets only its id
(``secrets.token_urlsafe``), never the token. A session ends when it is signed out, after
``IDLE_SECONDS`` without a request, or ``LIFETIME_SECONDS`` after it started, whichever comes
first. The table lives in the serving process (``pgjobs serve`` is one process): a restart signs
everyone out, and a server run as several processes behind one address would need sticky
routing. It holds ``MAX_SESSIONS`` at most, the least recently used ended first.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pgjobs.web.auth import Access

#: Seconds a session lasts without a request.
IDLE_SECONDS = 2 * 3600
#: Seconds a session lasts at most, however busy.
LIFETIME_SECONDS = 12 * 3600
#: Sessions held at most.
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: what its token may do, whose actions it may follow (``owner``, a
    digest of the token), and its own key for CSRF tokens."""

    access: Access
    owner: bytes
    csrf_key: bytes
    started: float


@dataclass(slots=True)
class _Entry:
    session: Session
    seen: float


def _key(session_id: str) -> bytes:
    # Looked up by digest: neither the table nor a comparison's timing holds the id itself.
    return hashlib.sha256(session_id.encode()).digest()


class Sessions:
    """The sessions of one server. Thread-safe.

    Example::

        sessions = Sessions()
        session_id = sessions.start(Access.FULL, owner)  # the cookie's value
        sessions.get(session_id)  # the Session, or None once ended or expired
    """

    def __init__(
        self,
        *,
        idle_seconds: float = IDLE_SECONDS,
        lifetime_seconds: float = LIFETIME_SECONDS,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_seconds = idle_seconds
        self.lifetime_seconds = lifetime_seconds
        self.max_sessions = max_sessions
        self.clock = clock
        self._table: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, access: Access, owner: bytes) -> str:
        """A new session for a token that may do ``access``: its id, for the cookie."""
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        session = Session(access, owner, secrets.token_bytes(32), now)
        with self._lock:
            # The table is in order of last use: the idle sessions at its front are gone.
            while self._table:
                oldest_key, oldest = next(iter(self._table.items()))
                if now - oldest.seen < self.idle_seconds:
                    break
                del self._table[oldest_key]
            self._table[_key(session_id)] = _Entry(session, now)
            while len(self._table) > self.max_sessions:
                self._table.popitem(last=False)
        return session_id

    def get(self, session_id: str) -> Session | None:
        """The live session of ``session_id`` (its idle time starts again), or None."""
        if not 32 <= len(session_id) <= 128:
            return None
        key, now = _key(session_id), self.clock()
        with self._lock:
            entry = self._table.get(key)
            if entry is None:
                return None
            if (
                now - entry.seen >= self.idle_seconds
                or now - entry.session.started >= self.lifetime_seconds
            ):
                del self._table[key]
                return None
            entry.seen = now
            self._table.move_to_end(key)
            return entry.session

    def remaining(self, session: Session) -> int:
        """Whole seconds ``session`` may live at most (the cookie's Max-Age)."""
        return max(0, int(session.started + self.lifetime_seconds - self.clock()))

    def end(self, session_id: str) -> None:
        """Sign ``session_id`` out; an unknown id is nothing to end."""
        with self._lock:
            self._table.pop(_key(session_id), None)

    def __len__(self) -> int:
        return len(self._table)
