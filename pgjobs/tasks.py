"""Tasks: a registered handler (``Task``), the options a task is declared with (``TaskOptions``,
``HandlerOptions``) and how one is made from a function (``make_task``)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from pgjobs.errors import ConfigurationError, NonRetryableError
from pgjobs.payloads import (
    PayloadModel,
    PayloadProblem,
    PayloadTypes,
    check_versions,
    typed_payloads,
)
from pgjobs.rates import Rate, parse_named
from pgjobs.retry import DEFAULT_RETRY_BASE, DEFAULT_RETRY_CAP, RetryPolicy, check_rules
from pgjobs.submission import (
    DEFAULT_LEASE,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_QUEUE,
    MAX_LIMIT,
    check_limit,
    check_max_attempts,
    check_name,
    check_queue,
    check_seconds,
    check_timeout_fits_lease,
)
from pgjobs.targets import ExternalTarget, check_delivery_fits_lease


class TaskOptions(TypedDict, total=False):
    """The options of every task, as ``App.task`` and ``App.external_task`` take them; one left
    out takes the default named here."""

    #: The queue its jobs go to unless an enqueue names another (``"default"``).
    queue: str
    #: Attempts a job gets, the first included (5).
    max_attempts: int
    #: Seconds of the backoff between attempts, see ``RetryPolicy`` (1 and 3600).
    retry_base: float
    retry_cap: float
    #: Seconds one run may hold the job before it counts as lost (300).
    lease: float
    #: Never run twice: a job whose lease expires goes to ``dead_letter`` (False).
    at_most_once: bool
    #: The most jobs of the task running at once across every worker (None: no limit).
    concurrency: int | None
    #: The most starts per period, ``"100/s"`` (None: no limit).
    rate: str | Rate | None
    #: The most jobs of the task with the same group running at once (None: no limit).
    group_concurrency: int | None
    #: The most starts of the task's jobs with the same group per period, ``"10/m"`` (None: no
    #: limit).
    group_rate: str | Rate | None
    #: One job of a group at a time, in enqueue order; ``"hold"``: a dead job holds the group.
    ordered: bool | str
    #: Seconds a unique job debounced by a later enqueue waits after it (None: 0).
    debounce: float | None
    #: At most one job per unique key starts per so many seconds (None: no throttle).
    throttle: float | None


class HandlerOptions(TaskOptions, total=False):
    """``TaskOptions`` and those of a task a Python handler runs (``App.task``)."""

    #: The task's name (``module.function``).
    name: str | None
    #: The version of the payloads the handler takes (1).
    version: int
    #: Older version -> function returning the payload of the next version (None).
    upgrade: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] | None
    #: Seconds one run may take, shorter than ``lease`` (None: no limit but the lease).
    timeout: float | None
    #: The only exception classes worth a retry (None: every one).
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None
    #: Exception classes never retried: the job goes to dead_letter at once (non_retryable).
    never_retry_on: type[BaseException] | tuple[type[BaseException], ...] | None
    #: Seconds a retry waits after an exception of a class (or of a subclass), not the backoff.
    retry_delays: Mapping[type[BaseException], float] | None
    #: How many times a job may snooze (``raise pgjobs.Snooze(seconds)``) before one more sends
    #: it to dead_letter as ``snoozed_out`` (100).
    max_snoozes: int


#: How many times a job may snooze unless its task says otherwise.
DEFAULT_MAX_SNOOZES = 100


# Raised by Task.upgrade. Its qualified name is stored as dead_letter.error_type (alerts and
# queries match it), so it stays in this module.
class UpgradeFailed(NonRetryableError):
    """A task's ``upgrade`` function raised (or returned something other than a dict) for a
    job's payload: the job goes to ``dead_letter`` as ``non_retryable``, naming the step; the
    traceback of the upgrade's error is kept there."""

    def __init__(self, task: str, step: int, problem: str) -> None:
        super().__init__(
            f"upgrade of {task}'s payload from version {step} to {step + 1} failed: {problem}"
        )
        self.step = step


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
    #: Seconds one run may take before the worker stops it and counts the attempt as failed
    #: (reason "timeout"); None: no limit but the lease.
    timeout: float | None = None
    #: The most jobs of this task leased at once across every worker and host; None: no limit.
    #: Enforced by the claim (see ``queries.JOB_CLAIM_LIMITED``).
    concurrency: int | None = None
    #: At most so many starts of this task's jobs per period across every worker; None: no limit.
    rate: Rate | None = None
    #: The most jobs of this task with the same group leased at once, in all queues together
    #: (None: no limit).
    group_concurrency: int | None = None
    #: At most so many starts of this task's jobs with the same group per period, in all queues
    #: together, in any window of the period (None: no limit).
    group_rate: Rate | None = None
    #: False, True (one job per group at a time, in enqueue order across queues; a dead job
    #: releases its group) or "hold" (a dead job holds its group until it is redriven or purged).
    ordered: bool | str = False
    #: Seconds a unique job waits after the enqueue that debounced it (``on_conflict="debounce"``).
    debounce: float | None = None
    #: Seconds: at most one job per unique key starts per window.
    throttle: float | None = None
    #: How many times a job may snooze before one more sends it to dead_letter (snoozed_out).
    max_snoozes: int = DEFAULT_MAX_SNOOZES
    is_async: bool = False
    signature: inspect.Signature | None = None
    #: Set for an external task: its jobs are delivered over HTTP, not run by ``fn``.
    external: ExternalTarget | None = None
    #: The version of the payloads this handler takes; jobs stored with an older one are
    #: upgraded by ``upgrades`` (version -> function returning the payload of the next version).
    version: int = 1
    upgrades: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] = field(
        default_factory=dict, compare=False, repr=False
    )
    #: The checks of annotated parameters (None: the handler is untyped, nothing is checked).
    types: PayloadTypes | None = None
    #: Set when the handler takes one pydantic model or dataclass built from the payload.
    model: PayloadModel | None = None
    # Verdicts of check_payload by the payload's key names (binding looks at nothing else).
    _fits: dict[tuple[str, ...], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def limited(self) -> bool:
        """The task has a concurrency limit or a rate: its jobs are claimed under them."""
        return self.concurrency is not None or self.rate is not None

    @property
    def grouped(self) -> bool:
        """The task limits or orders the jobs of each group."""
        return (
            self.group_concurrency is not None
            or self.group_rate is not None
            or self.ordered is not False
        )

    def check_payload(self, payload: Any) -> str | None:
        """Why ``payload`` cannot be this handler's keyword arguments (or its model), with the
        type of each annotated value, or None when it can."""
        if self.model is None and isinstance(payload, dict):
            # The worker's path for every job: an untyped handler's verdict is remembered by
            # the payload's keys.
            verdict = self._binding(payload)
            if verdict is not None or self.types is None:
                return verdict
        problem = self.payload_problem(payload)
        return None if problem is None else problem.message

    def payload_problem(self, payload: Any, *, complete: bool = True) -> PayloadProblem | None:
        """``check_payload`` with the input field at fault (``payload`` or
        ``payload.<name>``). Without ``complete`` (at enqueue) the keys of a handler taking
        keyword arguments are not bound to its parameters: only the values' types are checked
        (a model's fields always are: the model is built from them)."""
        if not isinstance(payload, dict):
            return PayloadProblem(
                "payload", f"payload must be a JSON object, got {type(payload).__name__}"
            )
        if self.model is not None:
            if self.model.pydantic:
                return self.model.build(payload)[1]
            return self.model.check_fields(payload)
        verdict = self._binding(payload) if complete else None
        if verdict is not None:
            return PayloadProblem("payload", verdict)
        return None if self.types is None else self.types.problem(payload)

    def arguments(self, payload: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The keyword arguments to call the handler with for ``payload`` and None, or ({}, why
        the payload does not fit). A handler taking a model receives the instance built from the
        payload; any other handler, the payload's keys.

        Example: ``kwargs, problem = task.arguments({"amount": 12.5})``
        """
        if self.model is None:
            problem = self.check_payload(payload)
            return (payload, None) if problem is None else ({}, problem)
        instance, why = self.model.build(payload)
        return ({}, why.message) if why is not None else ({self.model.param: instance}, None)

    def upgrade(self, payload: dict[str, Any], version: int) -> dict[str, Any]:
        """``payload``, stored at ``version`` (older than this task's), upgraded step by step
        to this task's version. Raises ``UpgradeFailed`` naming the step that raised or did not
        return a dict, and ``ValueError`` when no upgrade from ``version`` is declared.

        Example: ``task.upgrade({"cents": 1250}, 1)`` with ``upgrade={1: to_v2}``
        """
        for step in range(version, self.version):
            upgrade = self.upgrades.get(step)
            if upgrade is None:
                oldest = (
                    f"it upgrades payloads from version {min(self.upgrades)} on"
                    if self.upgrades
                    else "it declares no upgrade"
                )
                raise ValueError(
                    f"payload of version {version} is too old for task {self.name!r} at "
                    f"version {self.version}: {oldest}"
                )
            try:
                payload = upgrade(payload)
            except Exception as exc:
                raise UpgradeFailed(self.name, step, f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(payload, dict):
                raise UpgradeFailed(
                    self.name, step, f"it returned {type(payload).__name__}, not a dict"
                )
        return payload

    def _binding(self, payload: dict[str, Any]) -> str | None:
        """Why ``payload``'s keys cannot be the handler's keyword arguments, or None."""
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
    /,
    *,
    external: ExternalTarget | None = None,
    **options: Unpack[HandlerOptions],
) -> Task:
    """The task of handler ``fn`` with ``options`` checked and their defaults filled in, or the
    external task delivered to ``external``; refuses what ``App.task`` refuses.

    Example: ``make_task(send, name="emails.send", queue="emails", lease=60)``
    """
    refuse_unknown(options, HandlerOptions, "make_task")
    queue = check_queue(options.get("queue", DEFAULT_QUEUE))
    max_attempts = options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    check_max_attempts(max_attempts)
    lease = check_seconds("lease", options.get("lease", DEFAULT_LEASE), positive=True)
    name = options.get("name")
    task_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
    task_name = check_name("task", task_name)
    timeout = options.get("timeout")
    if timeout is not None:
        timeout = check_timeout_fits_lease(task_name, timeout, lease)
    version = options.get("version", 1)
    upgrades = check_versions(task_name, version, options.get("upgrade"))
    concurrency = options.get("concurrency")
    if concurrency is not None:
        check_limit("concurrency", concurrency)
    rate = options.get("rate")
    group_concurrency, ordered = check_grouping(
        task_name, options.get("group_concurrency"), options.get("ordered", False)
    )
    group_rate = options.get("group_rate")
    debounce = options.get("debounce")
    if debounce is not None:
        debounce = check_seconds("debounce", debounce)
    throttle = options.get("throttle")
    if throttle is not None:
        throttle = check_seconds("throttle", throttle, positive=True)
    max_snoozes = options.get("max_snoozes", DEFAULT_MAX_SNOOZES)
    if (
        isinstance(max_snoozes, bool)
        or not isinstance(max_snoozes, int)
        or not (0 <= max_snoozes <= MAX_LIMIT)
    ):
        raise ConfigurationError(
            f"max_snoozes must be a whole number in 0..{MAX_LIMIT:,}, got {max_snoozes!r}",
            field="max_snoozes",
        )
    signature: inspect.Signature | None = None
    types_: PayloadTypes | None = None
    model: PayloadModel | None = None
    if external is not None:
        check_delivery_fits_lease(task_name, external.timeout, lease)
    else:
        with contextlib.suppress(TypeError, ValueError):  # builtins without a signature
            signature = inspect.signature(fn)
        if signature is not None:
            # Decided once: an untyped handler costs nothing per job.
            types_, model = typed_payloads(fn, signature, f"task {task_name!r}")
    return Task(
        name=task_name,
        fn=fn,
        queue=queue,
        max_attempts=max_attempts,
        retry=RetryPolicy(
            check_seconds(
                "retry_base", options.get("retry_base", DEFAULT_RETRY_BASE), positive=True
            ),
            check_seconds("retry_cap", options.get("retry_cap", DEFAULT_RETRY_CAP), positive=True),
            *check_rules(
                options.get("retry_on"),
                options.get("never_retry_on"),
                options.get("retry_delays"),
            ),
        ),
        lease=lease,  # a float: the claim binds leases as float8[]
        at_most_once=options.get("at_most_once", False),
        timeout=timeout,
        concurrency=concurrency,
        rate=None if rate is None else Rate.parse(rate),
        group_concurrency=group_concurrency,
        group_rate=None if group_rate is None else parse_named("group_rate", group_rate),
        ordered=ordered,
        debounce=debounce,
        throttle=throttle,
        max_snoozes=max_snoozes,
        is_async=external is None and inspect.iscoroutinefunction(fn),
        signature=signature,
        external=external,
        version=version,
        upgrades=upgrades,
        types=types_,
        model=model,
    )


def check_grouping(
    task: str, group_concurrency: object, ordered: object
) -> tuple[int | None, bool | str]:
    """Refuse a ``group_concurrency`` below 1, an ``ordered`` that is not True, False or
    ``"hold"``, and an ordered task that would run more than one job of a group at once.

    Example: ``check_grouping("t", 2, False)`` returns ``(2, False)``.
    """
    if group_concurrency is not None:
        group_concurrency = check_limit("group_concurrency", group_concurrency)
    if ordered not in (True, False, "hold") or not isinstance(ordered, bool | str):
        raise ConfigurationError(
            f"ordered must be True, False or 'hold', not {ordered!r}", field="ordered"
        )
    if ordered is not False and group_concurrency is not None and group_concurrency > 1:
        raise ConfigurationError(
            f"task {task!r} is ordered, which runs one job of a group at a time: "
            f"group_concurrency={group_concurrency} contradicts it (leave it out, or set 1)",
            field="group_concurrency",
        )
    return group_concurrency, ordered


def refuse_unknown(options: Mapping[str, object], kind: type, where: str) -> None:
    """Raise the ``TypeError`` Python raises for a keyword argument that is not an option of
    TypedDict ``kind``: ``**options`` would otherwise take it silently.

    Example: ``refuse_unknown({"queu": "x"}, TaskOptions, "App.external_task")`` raises.
    """
    allowed: frozenset[str] = getattr(kind, "__optional_keys__", frozenset())
    for key in options:
        if key not in allowed:
            raise TypeError(f"{where}() got an unexpected keyword argument {key!r}")
