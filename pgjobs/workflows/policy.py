"""How a workflow's step is tried again: ``StepPolicy`` (attempts and a ``RetryPolicy``), the
workflow's default for its steps, and ``step_policy``, the decorator that gives one function its
own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pgjobs.errors import ConfigurationError
from pgjobs.retry import RetryPolicy
from pgjobs.submission import MAX_LIMIT

#: Attempts a step gets unless its ``step_policy`` says otherwise, the first included.
DEFAULT_STEP_ATTEMPTS = 3

#: The attribute ``step_policy`` sets on a step's function.
_POLICY_ATTRIBUTE = "__pgjobs_step_policy__"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """How one step is tried: ``attempts`` in all (the first included), waiting between them as
    ``retry`` says (its backoff, and the errors worth another attempt: ``retry_on``,
    ``never_retry_on``, ``delays``).

    Example: ``StepPolicy(attempts=5, retry=pgjobs.RetryPolicy(base=2, cap=60))``
    """

    attempts: int = DEFAULT_STEP_ATTEMPTS
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        attempts = self.attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise ConfigurationError(
                f"a step's attempts must be a whole number, got {attempts!r}", field="attempts"
            )
        if not 1 <= attempts <= MAX_LIMIT:
            raise ConfigurationError(
                f"a step's attempts must be in 1..{MAX_LIMIT:,}, got {attempts}", field="attempts"
            )
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError(
                f"a step's retry must be a pgjobs.RetryPolicy, got {self.retry!r:.60}",
                field="retry",
            )


def step_policy(
    *, attempts: int = DEFAULT_STEP_ATTEMPTS, retry: RetryPolicy | None = None
) -> Callable[[F], F]:
    """Give a step's function its own policy: ``attempts`` in all (the first included) and the
    ``retry`` policy between them (default: the workflow's backoff and ``retry_on``). The
    function is returned as it is, callable as before.

    Example::

        @pgjobs.step_policy(attempts=5, retry=pgjobs.RetryPolicy(base=2, retry_on=(TimeoutError,)))
        def charge_card(order_id: int) -> dict: ...
    """
    policy = (attempts, retry)
    StepPolicy(attempts, retry if retry is not None else RetryPolicy())  # checked now

    def mark(fn: F) -> F:
        try:
            setattr(fn, _POLICY_ATTRIBUTE, policy)
        except (AttributeError, TypeError):
            raise ConfigurationError(
                f"step_policy cannot mark {fn!r:.60}: decorate a function"
            ) from None
        return fn

    return mark


def policy_of(fn: Callable[..., Any], defaults: StepPolicy) -> StepPolicy:
    """The policy of step function ``fn``: its ``step_policy``, else ``defaults``."""
    marked = getattr(fn, _POLICY_ATTRIBUTE, None)
    if marked is None:
        return defaults
    attempts, retry = marked
    return StepPolicy(attempts, retry if retry is not None else defaults.retry)
