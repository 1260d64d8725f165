"""Tasks: the registry of handlers, their retry policy, and what a job submission looks like."""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from pgjobs.errors import ConfigurationError

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds a claimed job is leased before another worker may run it again.
DEFAULT_LEASE = 300.0
#: PostgreSQL smallint bounds, the range of ``priority``.
PRIORITY_RANGE = (-32768, 32767)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with equal jitter, in seconds.

    The n-th retry waits ``d/2 + uniform(0, d/2)`` where ``d = min(cap, base * 2**(n-1))``:
    never less than half the nominal delay, so retries of one outage spread out without
    collapsing onto each other.

    Example: ``RetryPolicy(base=2, cap=60).delay(3)`` is between 4 and 8 seconds.
    """

    base: float = 1.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        if not self.base > 0:
            raise ConfigurationError(f"retry_base must be > 0 seconds, got {self.base}")
        if self.cap < self.base:
            raise ConfigurationError(
                f"retry_cap ({self.cap}s) must be at least retry_base ({self.base}s)"
            )

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before the retry that follows failed attempt number ``attempt``."""
        nominal = min(self.cap, self.base * 2.0 ** min(attempt - 1, 62))
        half = nominal / 2.0
        return half + rand() * half


@dataclass(frozen=True, slots=True)
class Task:
    """A registered handler. Calling the task calls the function directly (no queue)."""

    name: str
    fn: Callable[..., Any]
    queue: str = DEFAULT_QUEUE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: Seconds; how long a claimed job of this task may run before it counts as lost.
    lease: float = DEFAULT_LEASE
    #: Never run twice: a job whose lease expired goes to dead_letter instead of running again.
    at_most_once: bool = False
    is_async: bool = False
    signature: inspect.Signature | None = None
    # Verdicts of check_payload by the payload's key names (binding looks at nothing else).
    _fits: dict[tuple[str, ...], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def check_payload(self, payload: Any) -> str | None:
        """Why ``payload`` cannot be this handler's keyword arguments, or None when it can."""
        if not isinstance(payload, dict):
            return f"payload must be a JSON object, got {type(payload).__name__}"
        if self.signature is None:
            return None
        keys = tuple(payload)
        try:
            return self._fits[keys]
        except KeyError:
            pass
        try:
            self.signature.bind(**payload)
            verdict = None
        except TypeError as exc:
            verdict = f"payload does not fit {self.name}{self.signature}: {exc}"
        if len(self._fits) < 1024:  # payloads with ever-new key sets are not worth remembering
            self._fits[keys] = verdict
        return verdict


def make_task(
    fn: Callable[..., Any],
    *,
    name: str | None,
    queue: str,
    max_attempts: int,
    retry_base: float,
    retry_cap: float,
    lease: float,
    at_most_once: bool = False,
) -> Task:
    check_queue(queue)
    check_max_attempts(max_attempts)
    if not lease > 0:
        raise ConfigurationError(f"lease must be > 0 seconds, got {lease}")
    task_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
    if not task_name or not isinstance(task_name, str):
        raise ConfigurationError("a task name must be a non-empty string")
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    return Task(
        name=task_name,
        fn=fn,
        queue=queue,
        max_attempts=max_attempts,
        retry=RetryPolicy(float(retry_base), float(retry_cap)),
        lease=float(lease),  # bound as float8[] by the claim: an int among floats cannot be
        at_most_once=at_most_once,
        is_async=inspect.iscoroutinefunction(fn),
        signature=signature,
    )


def check_queue(queue: str) -> None:
    if not isinstance(queue, str) or not queue.strip():
        raise ConfigurationError("a queue name must be a non-empty string")
    if len(queue) > 200:
        raise ConfigurationError(f"queue name is {len(queue)} characters long; the limit is 200")


def check_max_attempts(max_attempts: int) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be a whole number >= 1, got {max_attempts!r}")


class JobSpec(NamedTuple):
    """One job to enqueue; ``None`` options take the task's (or pgjobs') defaults.

    ``run_at`` and ``run_in`` (seconds or a timedelta) are alternatives, as are ``expires_at``
    and ``expires_in``. Datetimes must be timezone-aware. Immutable; a named tuple rather than
    a frozen dataclass because building one is several times cheaper, which shows in a bulk
    enqueue.

    Example: ``JobSpec("send_email", {"to": "a@example.com"}, run_in=60, idempotency_key="w-1")``
    """

    task: str
    payload: dict[str, Any] | None = None
    queue: str | None = None
    priority: int = 0
    run_at: datetime | None = None
    run_in: float | timedelta | None = None
    max_attempts: int | None = None
    expires_at: datetime | None = None
    expires_in: float | timedelta | None = None
    idempotency_key: str | None = None
