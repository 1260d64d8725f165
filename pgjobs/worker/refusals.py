"""A database that refuses the worker's round trips (read-only after a failover to a standby, a
privilege revoked): how long to wait before the next try, and what to log meanwhile."""

from __future__ import annotations

import logging
import random

log = logging.getLogger("pgjobs.worker")

#: Seconds before the first retry of a refused round trip: doubling while the refusal repeats.
FIRST_DELAY = 0.25
#: The longest wait between two tries (seconds).
MAX_DELAY = 30.0
#: Seconds between two log lines about the same refusal (each with how often it came).
REPORT_EVERY = 30.0


class Refusals:
    """The refusals of the worker's round trips in a row: a backoff with jitter while they go on
    (``refused`` returns the wait), one log line for a new refusal and then one per
    ``REPORT_EVERY`` seconds with a count, and one line when a trip is accepted again. Times are
    the event loop's clock, in seconds.

    Example::

        wait = refusals.refused("permission denied ...", loop.time())  # 0.125..0.25
        refusals.accepted()  # the next trip went through
    """

    def __init__(self) -> None:
        self.streak = 0  # refusals in a row
        self._error = ""  # the last refusal's message
        self._unreported = 0  # refusals since the last line
        self._reported_at = 0.0

    def refused(self, error: str, now: float) -> float:
        """A round trip was refused with ``error``: log it (or count it), and return how long
        to wait before the next try: ``FIRST_DELAY`` doubling up to ``MAX_DELAY``, each wait
        between half and all of that (jitter, so that workers do not retry in step)."""
        self.streak += 1
        self._unreported += 1
        delay = min(MAX_DELAY, FIRST_DELAY * 2.0 ** min(self.streak - 1, 16))
        if error != self._error:
            self._error = error
            log.error("%s; trying again within %.1fs (backing off while it repeats)", error, delay)
        elif now - self._reported_at >= REPORT_EVERY:
            log.error(
                "%s (%d times in %.0fs); trying again within %.1fs",
                error,
                self._unreported,
                now - self._reported_at,
                delay,
            )
        else:
            return delay * random.uniform(0.5, 1.0)  # counted, said later
        self._unreported = 0
        self._reported_at = now
        return delay * random.uniform(0.5, 1.0)

    def accepted(self) -> None:
        """A round trip went through: the next refusal starts a new backoff."""
        if self.streak:
            log.warning(
                "the database accepts the worker's round trips again (after %d refusal(s))",
                self.streak,
            )
            self.streak = 0
            self._error = ""
            self._unreported = 0
