"""Whether a failed job is tried again, and how long it waits first: ``RetryPolicy``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

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

    Which errors are worth a retry: all of them, unless ``retry_on`` names the only ones (an
    exception of another class is not retried); never those of ``never_retry_on`` (which wins).
    How long a retry waits: an exception's own ``retry_after`` (seconds) when it carries one,
    else the delay ``delays`` gives its class (or the nearest base class it names), else the
    backoff.

    Example: ``RetryPolicy(base=2, cap=60).delay(3)`` is between 4 and 8 seconds.
    """

    base: float = DEFAULT_RETRY_BASE
    cap: float = DEFAULT_RETRY_CAP
    retry_on: tuple[type[BaseException], ...] | None = None
    never_retry_on: tuple[type[BaseException], ...] = ()
    # Compared, not hashed (a mapping has no hash): a task stays hashable.
    delays: Mapping[type[BaseException], float] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    def __post_init__(self) -> None:
        check_seconds("retry_base", self.base, positive=True)
        check_seconds("retry_cap", self.cap, positive=True)
        if self.cap < self.base:
            raise ConfigurationError(
                f"retry_cap ({self.cap}s) must be at least retry_base ({self.base}s)",
                field="retry_cap",
            )

    def retries(self, exc: BaseException) -> bool:
        """Whether an attempt that raised ``exc`` is worth another (attempts left aside)."""
        if self.never_retry_on and isinstance(exc, self.never_retry_on):
            return False
        return self.retry_on is None or isinstance(exc, self.retry_on)

    def delay(
        self,
        attempt: int,
        exc: BaseException | None = None,
        rand: Callable[[], float] = random.random,
    ) -> float:
        """Seconds to wait before the retry that follows failed attempt number ``attempt``,
        which raised ``exc``."""
        if exc is not None:
            own = _retry_after(exc)
            if own is not None:
                return own
            for cls in type(exc).__mro__:
                if cls in self.delays:
                    return self.delays[cls]
        nominal = min(self.cap, self.base * 2.0 ** min(attempt - 1, 62))
        half = nominal / 2.0
        return half + rand() * half


#: The longest wait an exception's ``retry_after`` may ask for (a day): beyond it, the backoff.
MAX_RETRY_AFTER = 86_400.0


def _retry_after(exc: BaseException) -> float | None:
    """The seconds ``exc.retry_after`` asks to wait, when it is a number in 0..MAX_RETRY_AFTER
    (an exception of a library may carry anything under that name: anything else is ignored,
    even an int beyond any float or a property that raises)."""
    try:
        value = getattr(exc, "retry_after", None)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        seconds = float(value)
    except BaseException:  # a hostile property or __float__ (even one raising SystemExit)
        return None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_RETRY_AFTER:
        return None
    return seconds


def check_rules(
    retry_on: object, never_retry_on: object, delays: object
) -> tuple[
    tuple[type[BaseException], ...] | None,
    tuple[type[BaseException], ...],
    Mapping[type[BaseException], float],
]:
    """``retry_on``, ``never_retry_on`` (an exception class or a tuple of them; None) and
    ``delays`` (exception class -> seconds) as ``RetryPolicy`` takes them; anything else is
    refused with one line naming the option.

    Example: ``check_rules((TimeoutError,), None, {TimeoutError: 30})``
    """
    on = None if retry_on is None else _classes("retry_on", retry_on)
    never = () if never_retry_on is None else _classes("never_retry_on", never_retry_on)
    waits: dict[type[BaseException], float] = {}
    if delays is not None:
        if not isinstance(delays, Mapping):
            raise ConfigurationError(
                "retry_delays must map exception classes to seconds, e.g. {TimeoutError: 30}",
                field="retry_delays",
            )
        for cls, seconds in delays.items():
            (checked,) = _classes("retry_delays", cls)
            waits[checked] = check_seconds(f"retry_delays[{checked.__name__}]", seconds)
    return on, never, MappingProxyType(waits)


def _classes(name: str, value: object) -> tuple[type[BaseException], ...]:
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(
                f"{name} takes exception classes (e.g. TimeoutError), not {item!r}", field=name
            )
    return tuple(items)
