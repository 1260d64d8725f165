"""Tasks: the registry of handlers, their retry policy, and what a job submission looks like."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import math
import random
import re
import sys
import types
import typing
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from pgjobs.errors import ConfigurationError, NonRetryableError

log = logging.getLogger("pgjobs")

DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 5
#: Seconds a claimed job is leased before another worker may run it again.
DEFAULT_LEASE = 300.0
#: PostgreSQL smallint bounds, the range of ``priority``.
PRIORITY_RANGE = (-32768, 32767)

# Limits at the door: every entry point (the API, the CLI) checks values against these before
# anything is written, so that a stored job can always be claimed, settled, dead-lettered and shown.

#: Characters in a task or queue name. Names are btree keys (claim, dead-letter grouping) whose
#: rows PostgreSQL caps near 2,700 bytes; 200 characters (800 bytes at most) leave room for the
#: other columns of a composite index, and a longer name is a mistake, not a name.
MAX_NAME_LENGTH = 200
#: UTF-8 bytes in an idempotency key: it is a btree key of the three tables (same cap as above).
#: 512 bytes hold any hash, UUID or composite business key.
MAX_KEY_BYTES = 512
#: Seconds in a delay (run_in, expires_in), a lease and a retry delay: a century. Longer values are
#: typing errors, and far longer ones overflow PostgreSQL's interval and Python's datetime.
MAX_SECONDS = 100 * 365.25 * 86400
#: Attempts a job may be given: the attempts column is an int4, and a job that fails this often
#: has failed for good.
MAX_ATTEMPTS_LIMIT = 1_000_000
#: Years a run_at / expires_at may fall in, in UTC. PostgreSQL's timestamptz goes further (4713 BC
#: to 294276 AD) but Python's datetime cannot load a row outside 1..9999, and one such row would
#: break every claim or `job show` that reads it.
YEAR_RANGE = (1, 9999)


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


#: Seconds an external task's delivery waits for the downstream's answer unless told otherwise.
DEFAULT_EXTERNAL_TIMEOUT = 10.0
#: Characters in a downstream URL: a longer one is a mistake (and would not fit a request line
#: most servers accept).
MAX_URL_LENGTH = 2000
# An HTTP header name is a "token" (RFC 9110 5.1); a value is visible ASCII, spaces and tabs (no CR
# or LF: a header value must never be able to start another header).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
#: Headers pgjobs writes itself on every delivery: a task may not set them. (It writes
#: User-Agent and Accept too, unless the task sets its own.)
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "connection",
        "transfer-encoding",
        "pgjobs-job-id",
        "pgjobs-attempt",
    }
)


def check_url(name: str, url: object) -> str:
    """Refuse a downstream URL that is not ``http://`` or ``https://`` with a host, that holds
    a user or password (credentials belong in a header, which is never logged), or spaces or
    control characters.

    Example: ``check_url("url", "https://billing.internal/jobs")`` returns the URL.
    """
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"{name} must be a non-empty http:// or https:// URL", field=name)
    if len(url) > MAX_URL_LENGTH or not url.isascii() or not url.isprintable() or " " in url:
        raise ConfigurationError(
            f"{name} {url[:80]!r} must be a URL of at most {MAX_URL_LENGTH} printable ASCII "
            "characters without spaces (percent-encode the rest)",
            field=name,
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"{name} {url!r} is not a valid URL: {exc}", field=name) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"{name} {url!r} must be an http:// or https:// URL with a host", field=name
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(
            f"{name} must not hold a user or password; send credentials in a header "
            "(headers={'Authorization': ...})",
            field=name,
        )
    if port == 0:
        raise ConfigurationError(f"{name} {url!r}: port 0 cannot be connected to", field=name)
    if parts.fragment:
        raise ConfigurationError(f"{name} {url!r} must not hold a #fragment", field=name)
    return url


def check_headers(
    name: str, headers: Mapping[str, str] | Iterable[tuple[str, str]] | None
) -> tuple[tuple[str, str], ...]:
    """Refuse HTTP headers whose name is not a token or whose value holds control characters or
    non-ASCII text, and the headers pgjobs writes itself (``RESERVED_HEADERS``). Returns them as
    (name, value) pairs. Messages name the header, never its value (it may be a secret).

    Example: ``check_headers("headers", {"Authorization": "Bearer s3cret"})``
    """
    if headers is None:
        return ()
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
    seen: set[str] = set()
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ConfigurationError(f"{name} must map header names to values", field=name)
        key, value = pair
        if not isinstance(key, str) or not _HEADER_NAME.fullmatch(key):
            raise ConfigurationError(
                f"{name}: {str(key)[:80]!r} is not an HTTP header name (letters, digits, -)",
                field=name,
            )
        if key.lower() in RESERVED_HEADERS:
            raise ConfigurationError(f"{name}: pgjobs sets the {key} header itself", field=name)
        if key.lower() in seen:
            raise ConfigurationError(f"{name}: the {key} header is given twice", field=name)
        seen.add(key.lower())
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            raise ConfigurationError(
                f"{name}: the value of the {key} header must be printable ASCII text "
                "(no line breaks)",
                field=name,
            )
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class ExternalTarget:
    """Where the jobs of an external task are delivered: an HTTP endpoint that receives each job
    as a JSON POST and reports its outcome later (``POST /api/v1/jobs/{id}/outcome``).

    On a task, what it leaves None (or empty) comes from the worker's defaults
    (``WorkerConfig.external``, `pgjobs work --external-url/--external-timeout/--external-header`).
    ``timeout`` (seconds) bounds one delivery: connecting, sending, and the answer's head.
    Header values are secrets: ``repr`` never shows them.

    Example: ``ExternalTarget("https://billing.internal/jobs", timeout=5,
    headers=(("Authorization", "Bearer s3cret"),))``
    """

    url: str | None = None
    timeout: float | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.url is not None:
            check_url("url", self.url)
        if self.timeout is not None:
            object.__setattr__(
                self, "timeout", check_seconds("timeout", self.timeout, positive=True)
            )
        object.__setattr__(self, "headers", check_headers("headers", self.headers))

    def __repr__(self) -> str:
        names = ", ".join(name for name, _ in self.headers)
        return f"ExternalTarget(url={self.url!r}, timeout={self.timeout!r}, headers=[{names}])"


# --- typed payloads and versions ----------------------------------------------------------------

#: A check of one payload value against a parameter's annotation: None when it fits, else the
#: problem, starting with ``path`` (``payload.amount``, ``payload.items[2]``).
Check = Callable[[Any, str], "str | None"]

#: Seconds a job whose payload version is newer than this worker's task is held back after this
#: worker gives it back (so it does not claim the same job again at once while an up-to-date
#: worker may).
NEWER_VERSION_HOLD = 5.0


class PayloadProblem(NamedTuple):
    """Why a payload does not fit its task: the input ``field`` at fault (``payload`` or
    ``payload.<name>``) and a message naming it, the expected and the received type."""

    field: str
    message: str


class UpgradeFailed(NonRetryableError):
    """A task's ``upgrade`` function raised (or returned something other than a dict) for a
    job's payload: the job goes to ``dead_letter`` as ``non_retryable``, naming the step; the
    traceback of the upgrade's error is kept there."""

    def __init__(self, task: str, step: int, problem: str) -> None:
        super().__init__(
            f"upgrade of {task}'s payload from version {step} to {step + 1} failed: {problem}"
        )
        self.step = step


class _Unsupported(Exception):
    """An annotation pgjobs does not check (a class of the application's, datetime, ...)."""


def _type_name(annotation: Any) -> str:
    if annotation is type(None) or annotation is None:
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")


def _received(value: Any) -> str:
    """The JSON type of ``value`` as Python names it."""
    return "None" if value is None else type(value).__name__


def _instance_check(kinds: type | tuple[type, ...], expected: str) -> Check:
    # A bool is an int in Python, never a number in a payload.
    takes_bool = bool in kinds if isinstance(kinds, tuple) else kinds is bool

    def check(value: Any, path: str) -> str | None:
        if isinstance(value, kinds) and (takes_bool or not isinstance(value, bool)):
            return None
        return f"{path}: expected {expected}, got {_received(value)}"

    return check


def _list_check(item: Check | None, expected: str) -> Check:
    def check(value: Any, path: str) -> str | None:
        # A tuple is accepted at enqueue: JSON stores it as an array.
        if not isinstance(value, list | tuple):
            return f"{path}: expected {expected}, got {_received(value)}"
        if item is not None:
            for index, element in enumerate(value):
                problem = item(element, f"{path}[{index}]")
                if problem is not None:
                    return problem
        return None

    return check


def _dict_check(item: Check | None, expected: str) -> Check:
    def check(value: Any, path: str) -> str | None:
        if not isinstance(value, dict):
            return f"{path}: expected {expected}, got {_received(value)}"
        for key, element in value.items():
            if not isinstance(key, str):
                return f"{path}: expected {expected}, got a key of type {_received(key)}"
            if item is not None:
                problem = item(element, f"{path}[{key!r}]")
                if problem is not None:
                    return problem
        return None

    return check


def _union_check(members: list[Check], expected: str) -> Check:
    def check(value: Any, path: str) -> str | None:
        if any(member(value, path) is None for member in members):
            return None
        return f"{path}: expected {expected}, got {_received(value)}"

    return check


def _optional_check(inner: Check) -> Check:
    def check(value: Any, path: str) -> str | None:
        return None if value is None else inner(value, path)

    return check


def _literal_check(values: tuple[Any, ...], expected: str) -> Check:
    # True == 1 in Python: a value matches a literal of the same type only.
    def check(value: Any, path: str) -> str | None:
        if any(type(value) is type(v) and value == v for v in values):
            return None
        return f"{path}: expected {expected}, got {_received(value)} {str(value)[:40]!r}"

    return check


_ACCEPTS_ANYTHING = (Any, object, inspect.Parameter.empty)


def compile_check(annotation: Any) -> Check | None:
    """The check of a payload value against ``annotation``: None when anything fits (``Any``,
    ``object``, no annotation). Supports ``int``, ``float`` (a JSON integer fits; a bool never
    fits a number), ``str``, ``bool``, ``None``, unions and ``Optional``, ``list[X]``,
    ``dict[str, X]``, plain ``list`` / ``dict``, ``Literal[...]`` and ``Annotated[X, ...]``;
    raises ``_Unsupported`` for any other annotation.

    Example: ``compile_check(list[int])(["a"], "payload.ids")`` is
    ``"payload.ids[0]: expected int, got str"``.
    """
    if any(annotation is anything for anything in _ACCEPTS_ANYTHING):
        return None
    expected = _type_name(annotation)
    if annotation is None or annotation is type(None):
        return _instance_check(type(None), "None")
    simple: dict[Any, tuple[type, ...]] = {
        bool: (bool,),
        int: (int,),
        float: (int, float),
        str: (str,),
        dict: (dict,),
        list: (list, tuple),
    }
    if annotation in simple:
        return _instance_check(simple[annotation], expected)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return compile_check(args[0])
    if origin is typing.Union or origin is types.UnionType:
        members = [compile_check(arg) for arg in args]
        if any(member is None for member in members):
            return None
        others = [compile_check(arg) for arg in args if arg is not type(None)]
        if len(others) == 1 and others[0] is not None:  # Optional[X]: X's own message
            return _optional_check(others[0])
        return _union_check([m for m in members if m is not None], expected)
    if origin is typing.Literal:
        return _literal_check(args, expected)
    if origin is list:
        return _list_check(compile_check(args[0]) if args else None, expected)
    if origin is dict:
        if args and args[0] is not str:
            raise _Unsupported(annotation)
        return _dict_check(compile_check(args[1]) if args else None, expected)
    raise _Unsupported(annotation)


@dataclass(frozen=True, slots=True)
class PayloadTypes:
    """The checks of a handler's annotated parameters (those whose annotation accepts anything
    are left out), by parameter name."""

    checks: tuple[tuple[str, Check], ...]

    def problem(self, payload: Mapping[str, Any]) -> PayloadProblem | None:
        """The first value of ``payload`` that does not fit its parameter's annotation."""
        for name, check in self.checks:
            if name in payload:
                message = check(payload[name], f"payload.{name}")
                if message is not None:
                    return PayloadProblem(f"payload.{name}", message)
        return None


def payload_types(
    hints: Mapping[str, Any], names: Iterable[str], where: str
) -> PayloadTypes | None:
    """The checks of parameters (or fields) ``names`` from their resolved ``hints``; None when
    none has anything to check. An annotation pgjobs does not support is not checked (logged
    at debug level, ``where`` naming the handler)."""
    checks = []
    for name in names:
        try:
            check = compile_check(hints.get(name, inspect.Parameter.empty))
        except _Unsupported:
            log.debug("%s: %s's annotation %r is not checked", where, name, hints[name])
            continue
        if check is not None:
            checks.append((name, check))
    return PayloadTypes(tuple(checks)) if checks else None


@dataclass(frozen=True, slots=True)
class PayloadModel:
    """A handler's single parameter annotated with a pydantic model or a dataclass: the payload
    holds the model's fields, validated by it, and the handler receives the instance."""

    param: str
    cls: type
    #: The field checks of a dataclass (a pydantic model validates itself).
    types: PayloadTypes | None = None
    #: A dataclass's fields, and those without a default.
    fields: frozenset[str] = frozenset()
    required: frozenset[str] = frozenset()
    pydantic: bool = False

    def build(self, payload: dict[str, Any]) -> tuple[Any, PayloadProblem | None]:
        """(the instance, None), or (None, why ``payload`` does not make one)."""
        if self.pydantic:
            validation_error = sys.modules["pydantic"].ValidationError
            try:
                return self.cls.model_validate(payload), None  # type: ignore[attr-defined]
            except validation_error as exc:
                return None, _pydantic_problem(exc)
        problem = self.check_fields(payload)
        if problem is not None:
            return None, problem
        try:
            return self.cls(**payload), None
        except (TypeError, ValueError) as exc:  # the dataclass's own __post_init__ refused it
            return None, PayloadProblem(
                "payload", f"payload does not make a {self.cls.__name__}: {exc}"
            )

    def check_fields(self, payload: dict[str, Any]) -> PayloadProblem | None:
        """A dataclass's checks: no unknown key, every field without a default, their types."""
        unknown = sorted(set(payload) - self.fields)
        if unknown:
            return PayloadProblem(
                f"payload.{unknown[0]}",
                f"payload.{unknown[0]}: {self.cls.__name__} has no field {unknown[0]!r}",
            )
        missing = sorted(self.required - set(payload))
        if missing:
            return PayloadProblem(
                f"payload.{missing[0]}",
                f"payload.{missing[0]}: required by {self.cls.__name__}, missing",
            )
        return None if self.types is None else self.types.problem(payload)

    def dump(self, instance: Any) -> dict[str, Any]:
        """An instance of the model as the payload to store (JSON-ready for pydantic)."""
        if self.pydantic:
            dumped: dict[str, Any] = instance.model_dump(mode="json")
            return dumped
        return dataclasses.asdict(instance)


def _pydantic_problem(exc: Any) -> PayloadProblem:
    error = exc.errors()[0]
    location = [str(part) for part in error.get("loc", ())]
    field_name = f"payload.{location[0]}" if location else "payload"
    path = ".".join(["payload", *location])
    got = _received(error["input"]) if "input" in error else "nothing"
    return PayloadProblem(field_name, f"{path}: {error.get('msg', 'invalid')} (got {got})")


def _model_of(annotation: Any) -> tuple[type, bool] | None:
    """(the class, whether pydantic) when ``annotation`` is a pydantic model or a dataclass.
    pydantic is looked up only among the modules already loaded: a class deriving from its
    ``BaseModel`` means it is."""
    if not isinstance(annotation, type):
        return None
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(annotation, pydantic.BaseModel):
        return annotation, True
    if dataclasses.is_dataclass(annotation):
        return annotation, False
    return None


def _typed(
    fn: Callable[..., Any], signature: inspect.Signature, where: str
) -> tuple[PayloadTypes | None, PayloadModel | None]:
    """What a handler's annotations ask of its payloads, decided once, at registration."""
    named = [
        p
        for p in signature.parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if not any(p.annotation is not inspect.Parameter.empty for p in named):
        return None, None  # an untyped handler: nothing to check, per job or at enqueue
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # a name only importable under TYPE_CHECKING, a typo, ...
        log.debug(
            "%s: annotations not resolved (%s); its payloads are not type-checked", where, exc
        )
        return None, None
    if len(named) == 1:
        model = _model_of(hints.get(named[0].name))
        if model is not None:
            cls, is_pydantic = model
            return None, _payload_model(named[0].name, cls, is_pydantic, where)
    return payload_types(hints, [p.name for p in named], where), None


def _payload_model(param: str, cls: type, is_pydantic: bool, where: str) -> PayloadModel:
    if is_pydantic:
        return PayloadModel(param, cls, pydantic=True)
    fields_ = dataclasses.fields(cls)
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:
        log.debug("%s: %s's annotations not resolved (%s); not type-checked", where, cls, exc)
        hints = {}
    names = [f.name for f in fields_ if f.init]
    required = [
        f.name
        for f in fields_
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    return PayloadModel(
        param,
        cls,
        payload_types(hints, names, f"{where} ({cls.__name__})"),
        frozenset(names),
        frozenset(required),
    )


def check_versions(
    task: str, version: object, upgrade: Mapping[int, Callable[..., Any]] | None
) -> dict[int, Callable[[dict[str, Any]], dict[str, Any]]]:
    """Refuse a ``version`` that is not a whole number >= 1, and an ``upgrade`` that is not a
    dict from versions below it to callables forming one chain up to ``version - 1``. Returns
    the upgrades as a dict.

    Example: ``check_versions("t", 3, {1: v1_to_v2, 2: v2_to_v3})``
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigurationError(
            f"task {task!r}: version must be a whole number >= 1, got {version!r}", field="version"
        )
    steps = dict(upgrade or {})
    for step, fn in steps.items():
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step < version:
            raise ConfigurationError(
                f"task {task!r}: upgrade keys are the versions a payload is upgraded from, "
                f"1..{version - 1}; got {step!r}",
                field="upgrade",
            )
        if not callable(fn):
            raise ConfigurationError(
                f"task {task!r}: upgrade[{step}] must be a function (payload -> payload of "
                f"version {step + 1}), got {type(fn).__name__}",
                field="upgrade",
            )
    if steps and sorted(steps) != list(range(min(steps), version)):
        raise ConfigurationError(
            f"task {task!r}: upgrade must chain up to version {version}: every version from "
            f"{min(steps)} to {version - 1} needs its step, got {sorted(steps)}",
            field="upgrade",
        )
    return steps


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
    *,
    name: str | None,
    queue: str,
    max_attempts: int,
    retry_base: float,
    retry_cap: float,
    lease: float,
    at_most_once: bool = False,
    external: ExternalTarget | None = None,
    version: int = 1,
    upgrade: Mapping[int, Callable[..., Any]] | None = None,
    timeout: float | None = None,
    concurrency: int | None = None,
    rate: Rate | str | None = None,
) -> Task:
    check_queue(queue)
    check_max_attempts(max_attempts)
    lease = check_seconds("lease", lease, positive=True)
    task_name = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
    check_name("task", task_name)
    if timeout is not None:
        timeout = check_timeout_fits_lease(task_name, timeout, lease)
    upgrades = check_versions(task_name, version, upgrade)
    if concurrency is not None:
        check_limit("concurrency", concurrency)
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
            types_, model = _typed(fn, signature, f"task {task_name!r}")
    return Task(
        name=task_name,
        fn=fn,
        queue=queue,
        max_attempts=max_attempts,
        retry=RetryPolicy(float(retry_base), float(retry_cap)),
        lease=float(lease),  # bound as float8[] by the claim: an int among floats cannot be
        at_most_once=at_most_once,
        timeout=timeout,
        concurrency=concurrency,
        rate=None if rate is None else Rate.parse(rate),
        is_async=external is None and inspect.iscoroutinefunction(fn),
        signature=signature,
        external=external,
        version=version,
        upgrades=upgrades,
        types=types_,
        model=model,
    )


def check_timeout_fits_lease(task: str, timeout: object, lease: float) -> float:
    """A handler's ``timeout`` in seconds: > 0, at most ``MAX_SECONDS``, and shorter than the
    task's ``lease``. The worker that stops the handler at its timeout must still hold the job
    to record why it failed; with a timeout at or past the lease, the lease would run out first
    and the job be rescued as lost (reason ``lease_expired``), not timed out. A handler that
    extends its lease (``current_job().extend_lease``) is still stopped at its timeout.

    Example: ``check_timeout_fits_lease("reports.build", 30, 300.0)`` returns ``30.0``.
    """
    seconds = check_seconds("timeout", timeout, positive=True)
    if seconds >= lease:
        raise ConfigurationError(
            f"task {task!r}: the timeout ({seconds:g}s) must be shorter than the lease "
            f"({lease:g}s): the worker records the timeout while it still holds the job; "
            "raise the lease too",
            field="timeout",
        )
    return seconds


def check_delivery_fits_lease(task: str, timeout: float | None, lease: float) -> None:
    """Refuse a delivery ``timeout`` that is not shorter than the task's ``lease``: the lease
    is the downstream's whole deadline, delivery included, so a delivery that may outlast it
    would leave the downstream no time at all."""
    if timeout is not None and timeout >= lease:
        raise ConfigurationError(
            f"task {task!r}: the delivery timeout ({timeout:g}s) must be shorter than the "
            f"lease ({lease:g}s), which is the downstream's deadline to report",
            field="timeout",
        )


def check_queue(queue: str) -> None:
    """Refuse a queue name that is not 1..MAX_NAME_LENGTH printable characters."""
    check_name("queue", queue)


def check_name(kind: str, name: object) -> str:
    """Refuse a ``kind`` ("task", "queue") name that is empty, blank, longer than
    ``MAX_NAME_LENGTH`` characters, or holds control characters or lone surrogates (which are
    not text: they cannot be stored nor shown safely).

    Example: ``check_name("queue", "emails")`` returns ``"emails"``.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a {kind} name must be a non-empty string", field=kind)
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{kind} name is {len(name):,} characters long; the limit is {MAX_NAME_LENGTH}",
            field=kind,
        )
    if not name.isprintable() and any(_is_control(c) for c in name):
        raise ConfigurationError(
            f"{kind} name {ascii(name)[:80]} holds control characters or lone surrogates; "
            "use printable text",
            field=kind,
        )
    return name


def _is_control(char: str) -> bool:
    # Cc: C0/C1 controls (NUL, ESC, newlines); Cs: surrogates, which are not valid UTF-8.
    return unicodedata.category(char) in ("Cc", "Cs")


def check_key(key: object) -> str:
    """Refuse an idempotency key that is not a non-empty string of valid UTF-8 without NUL, at
    most ``MAX_KEY_BYTES`` bytes long.

    Example: ``check_key("order-42")`` returns ``"order-42"``.
    """
    if not isinstance(key, str) or not key:
        raise ConfigurationError(
            "idempotency_key must be a non-empty string", field="idempotency_key"
        )
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise ConfigurationError(
            "idempotency_key holds a lone surrogate, which is not valid UTF-8; use text",
            field="idempotency_key",
        ) from None
    if size > MAX_KEY_BYTES:
        raise ConfigurationError(
            f"idempotency_key is {size:,} bytes long; the limit is {MAX_KEY_BYTES} (hash a longer key)",
            field="idempotency_key",
        )
    if "\x00" in key:
        raise ConfigurationError(
            "idempotency_key holds a NUL character, which PostgreSQL refuses",
            field="idempotency_key",
        )
    return key


def check_max_attempts(max_attempts: int) -> None:
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise ConfigurationError(
            f"max_attempts must be a whole number in 1..{MAX_ATTEMPTS_LIMIT:,}, got {max_attempts!r}",
            field="max_attempts",
        )


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """A number of seconds (a number or a timedelta), finite, at most ``MAX_SECONDS``, and > 0
    when ``positive`` else >= 0; anything else is refused naming ``name``.

    Example: ``check_seconds("lease", 30)`` returns ``30.0``.
    """
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, got {value!r}", field=name)
    low = "> 0" if positive else ">= 0"
    if (
        not math.isfinite(seconds)
        or seconds < 0
        or (positive and seconds == 0)
        or seconds > MAX_SECONDS
    ):
        raise ConfigurationError(
            f"{name} must be a finite number of seconds {low} and at most {MAX_SECONDS:.0f} "
            f"(a century), got {value!r}",
            field=name,
        )
    return float(seconds)


#: The most jobs a concurrency limit may allow in flight at once, and the most starts a rate may
#: allow per period: far above what one database serves, and within an int4.
MAX_LIMIT = 1_000_000
#: The shortest and longest period of a rate, in seconds: a millisecond is finer than a claim
#: can act on; a rate over more than a day is a schedule, not a rate.
RATE_PERIOD_RANGE = (0.001, 86400.0)
_RATE_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``jobs`` job starts per ``seconds``, across every worker: a token bucket that
    holds up to ``jobs`` tokens and refills at ``jobs / seconds`` per second. After a quiet
    spell a burst of ``jobs`` may start at once; sustained, starts follow the rate. Written
    ``"100/s"``, ``"10/m"``, ``"5/10s"``, ``"1000/h"`` (units ms, s, m or min, h, d).

    Example: ``Rate.parse("100/s") == Rate(100, 1.0)``
    """

    jobs: int
    seconds: float

    def __post_init__(self) -> None:
        check_limit("rate", self.jobs)
        low, high = RATE_PERIOD_RANGE
        if (
            isinstance(self.seconds, bool)
            or not isinstance(self.seconds, int | float)
            or not low <= self.seconds <= high
        ):
            raise ConfigurationError(
                f"a rate's period must be {low:g}s to {high:g}s (a day), got {self.seconds!r}",
                field="rate",
            )

    @classmethod
    def parse(cls, text: object) -> Rate:
        """``text`` ("100/s", "10/m", "5/10s") as a Rate; anything else is refused with the
        forms it takes (``field="rate"``)."""
        if isinstance(text, Rate):
            return text
        match = _RATE.fullmatch(text.lower()) if isinstance(text, str) else None
        unit = _RATE_UNITS.get(match.group(3)) if match else None
        if match is None or unit is None:
            raise ConfigurationError(
                f"rate must be JOBS/PERIOD such as 100/s, 10/m, 5/10s or 1000/h, got {text!r}",
                field="rate",
            )
        count = float(match.group(2)) if match.group(2) else 1.0
        return cls(int(match.group(1)), count * unit)

    def __str__(self) -> str:
        for name in ("d", "h", "m", "s", "ms"):
            if self.seconds == _RATE_UNITS[name]:
                return f"{self.jobs}/{name}"
        return f"{self.jobs}/{self.seconds:g}s"


def rate_text(jobs: int | None, seconds: float | None) -> str | None:
    """A stored rate (``rate_jobs``, ``rate_seconds``) as it is written ("100/s", "5/10s"), or
    None without one."""
    return None if jobs is None or seconds is None else str(Rate(jobs, seconds))


def limits_text(concurrency: int | None, rate_jobs: int | None, rate_seconds: float | None) -> str:
    """A concurrency limit and a rate in words, as the CLI and the dashboard show a queue's:
    "at most 10 running, 100/s starts"; "" without either."""
    parts = [] if concurrency is None else [f"at most {concurrency} running"]
    rate = rate_text(rate_jobs, rate_seconds)
    if rate is not None:
        parts.append(f"{rate} starts")
    return ", ".join(parts)


def check_limit(name: str, value: object) -> int:
    """A concurrency limit or a rate's number of jobs: a whole number in 1..``MAX_LIMIT``;
    anything else is refused naming ``name``.

    Example: ``check_limit("concurrency", 5)`` returns ``5``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ConfigurationError(
            f"{name} must be a whole number in 1..{MAX_LIMIT:,}, got {value!r}", field=name
        )
    return value


def check_moment(name: str, value: object) -> datetime:
    """A timezone-aware datetime whose UTC time lies in years ``YEAR_RANGE`` (what both
    PostgreSQL and Python represent), returned in UTC; anything else is refused naming ``name``.

    Example: ``check_moment("run_at", datetime(2030, 1, 1, tzinfo=UTC))``
    """
    if not isinstance(value, datetime):
        raise ConfigurationError(
            f"{name} must be a datetime, got {type(value).__name__}", field=name
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise ConfigurationError(
            f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)), got {value}",
            field=name,
        )
    try:
        # In UTC: PostgreSQL reads offsets to the second, Python's may hold microseconds.
        return value.astimezone(UTC)
    except OverflowError:
        raise ConfigurationError(
            f"{name} {value.isoformat()} is outside years {YEAR_RANGE[0]}..{YEAR_RANGE[1]} in UTC",
            field=name,
        ) from None


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
