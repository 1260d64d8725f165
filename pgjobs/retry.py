"""How long a failed job waits before its next attempt: ``RetryPolicy``."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pgjobs.errors import ConfigurationError
from pgjobs.submission import check_seconds

#: Seconds: a task's backoff unless it sets ``retry_base`` / ``retry_cap``.
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_CAP = 3600.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with equal jitter, in seconds.

    The n-th retry waits ``d/2 + uniform(0, d/2)`` where ``d = min(cap, base * 2**(n-1))``:
    never less than half the nominal delay, so retries of one outage spread out without
    collapsing onto each other.

    Example: ``RetryPolicy(base=2, cap=60).delay(3)`` is between 4 and 8 seconds.
    """

    base: float = DEFAULT_RETRY_BASE
    cap: float = DEFAULT_RETRY_CAP

    def __post_init__(self) -> None:
        check_seconds("retry_base", self.base, positive=True)
        check_seconds("retry_cap", self.cap, positive=True)
        if self.cap < self.base:
            raise ConfigurationError(
                f"retry_cap ({self.cap}s) must be at least retry_base ({self.base}s)",
                field="retry_cap",
            )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before the retry that follows failed attempt number ``attempt``."""
        nominal = min(self.cap, self.base * 2.0 ** min(attempt - 1, 62))
        half = nominal / 2.0
        return half + rand() * half
