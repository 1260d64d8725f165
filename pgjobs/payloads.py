"""Typed payloads and their versions: what a handler's annotations ask of a payload, checked at
enqueue and when a worker starts the job, and the checks of a task's version and upgrades."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pgjobs.errors import ConfigurationError

log = logging.getLogger("pgjobs")

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


def typed_payloads(
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
