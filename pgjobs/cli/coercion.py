"""Option values converted without Pydantic when they plainly are what they should be.

typer converts every option value through a Pydantic ``TypeAdapter``; importing Pydantic costs
a command ~13 MiB resident and a good part of its start-up, a worker keeps both for its whole
life. pgjobs' options are strings, integers, floats, flags and lists of them; ``lean`` gives such a
parameter a conversion that handles the plain cases (``"8"`` for an int, ``"0.5"`` for a float,
any string for a str) and hands anything else (a value out of range, ``"1e3"``, ``"abc"``) to
typer's own conversion, so what a value becomes and every error message stay typer's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin

from typer import _click

try:  # typer's conversion API is internal: without it, typer converts as it always does
    from typer._coercion import RuntimeParam, build_runtime_param, resolve_type_descriptor
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - another typer version
    RuntimeParam = None  # type: ignore[assignment,misc]

_INT = re.compile(r"[+-]?\d{1,18}")
_FLOAT = re.compile(r"[+-]?\d{1,15}(?:\.\d{1,15})?")
#: Not converted here: typer's conversion handles them (and what is unknown).
_MISS = object()


def _plain(kind: type, value: Any) -> Any:
    """``value`` as ``kind`` when it plainly is one, else ``_MISS``."""
    if kind is str:
        return value if isinstance(value, str) else _MISS
    if kind is bool:
        return value if isinstance(value, bool) else _MISS
    if isinstance(value, bool):
        return _MISS
    if kind is int:
        if isinstance(value, int):
            return value
        return int(value) if isinstance(value, str) and _INT.fullmatch(value) else _MISS
    if kind is float:
        if isinstance(value, int | float):
            return float(value)
        return float(value) if isinstance(value, str) and _FLOAT.fullmatch(value) else _MISS
    return _MISS


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class LeanParam(RuntimeParam):
        """A str, int, float or bool parameter (or a list of them): plain values here, the rest
        through typer's Pydantic conversion, built on first need."""

        kind: type = str
        many: bool = False
        _typer: list[Any] = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: _click.Context) -> Any:
            if self.many:
                if isinstance(value, list | tuple):
                    items = [_plain(self.kind, item) for item in value]
                    if all(item is not _MISS and self._in_range(item) for item in items):
                        return items
            else:
                plain = _plain(self.kind, value)
                if plain is not _MISS and self._in_range(plain):
                    return plain
            if not self._typer:
                descriptor = resolve_type_descriptor(self.annotation, self.parameter_info)
                self._typer.append(build_runtime_param(descriptor))
            return self._typer[0]._coerce_value(value, param=param, ctx=ctx)

        def _in_range(self, value: Any) -> bool:
            if self.kind is str or self.kind is bool:
                return True
            low, high = self.parameter_info.min, self.parameter_info.max
            return (low is None or value >= low) and (high is None or value <= high)


def lean(param: Any) -> None:
    """Give ``param`` the lean conversion when its type is one it knows (str, int, float, bool, or
    a list of one) and nothing else (a parser, clamping, choices, a file) takes part."""
    if RuntimeParam is None or not isinstance(param, _TyperParameter):
        return
    descriptor = param.type_descriptor
    info = descriptor.parameter_info
    if param._runtime_param is not None or descriptor.file_annotation is not None:
        return
    if info.parser is not None or info.clamp or getattr(info, "click_type", None) is not None:
        return
    annotation: Any = descriptor.annotation
    many = get_origin(annotation) is list
    kind = get_args(annotation)[0] if many else annotation
    if kind not in (str, int, float, bool) or descriptor.choices is not None or descriptor.is_path:
        return
    param._runtime_param = LeanParam(info, annotation, kind=kind, many=many)
