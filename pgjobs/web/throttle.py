"""Failed sign-ins slowed per client address: the API's bearer tokens and the dashboard's login
form share one ``SignInThrottle``.

A client may fail ``FREE_FAILURES`` times; each failure after that makes it wait twice as long
as the one before (1 s, 2 s, 4 s ... up to ``MAX_WAIT`` seconds), and while it waits every
credential it presents, right or wrong, is answered 429 with ``Retry-After``: an answer that
told a right token from a wrong one would let the guessing go on. A success resets the address.
The table is bounded (``MAX_CLIENTS``, the least recently failed forgotten first), so a flood
of addresses costs a fixed amount of memory.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

#: Failures an address may make before it has to wait.
FREE_FAILURES = 5
#: Seconds of the first wait; each further failure doubles it.
FIRST_WAIT = 1.0
#: Seconds a wait is at most.
MAX_WAIT = 300.0
#: Seconds after its last failure that an address is forgotten (its count starts again).
FORGET_AFTER = 900.0
#: Addresses remembered at most.
MAX_CLIENTS = 10_000


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    until: float


class SignInThrottle:
    """Counts failed sign-ins per client address. Thread-safe (routes run in a thread pool).

    Example::

        throttle = SignInThrottle()
        wait = throttle.wait("203.0.113.9")  # None, or seconds to answer in Retry-After
    """

    def __init__(
        self,
        *,
        free_failures: int = FREE_FAILURES,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free_failures = free_failures
        self.max_clients = max_clients
        #: Where the time comes from (seconds; a test may move it).
        self.clock = clock
        self._table: OrderedDict[str, _Failures] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, client: str) -> int | None:
        """Whole seconds ``client`` must still wait before it may try again, or None."""
        now = self.clock()
        with self._lock:
            entry = self._table.get(client)
            if entry is None or entry.until <= now:
                return None
            return max(1, math.ceil(entry.until - now))

    def failed(self, client: str) -> int | None:
        """Count a failure of ``client``; the seconds it must now wait, or None."""
        now = self.clock()
        with self._lock:
            entry = self._table.pop(client, None)
            if entry is None or now - entry.last > FORGET_AFTER:
                entry = _Failures(0, now, now)
            entry.count += 1
            entry.last = now
            beyond = entry.count - self.free_failures
            if beyond > 0:
                entry.until = now + min(MAX_WAIT, FIRST_WAIT * 2 ** min(beyond - 1, 30))
            self._table[client] = entry
            while len(self._table) > self.max_clients:
                self._table.popitem(last=False)
        return self.wait(client)

    def succeeded(self, client: str) -> None:
        """``client`` signed in: its failures are forgotten."""
        with self._lock:
            self._table.pop(client, None)

    def __len__(self) -> int:
        return len(self._table)


def client_address(scope_client: object) -> str:
    """The address of an ASGI scope's ``client`` (host, port), "" when the server gave none.
    Behind a proxy it is the proxy's, unless uvicorn trusts its ``X-Forwarded-For``
    (``--forwarded-allow-ips``)."""
    if isinstance(scope_client, tuple | list) and scope_client:
        return str(scope_client[0])
    return ""


def too_many_message(wait: int) -> str:
    """What a throttled client is told (API and dashboard alike)."""
    return (
        f"too many failed sign-ins from your address: try again in {wait} second(s) "
        "(each further failure doubles the wait; a success resets it)"
    )
