"""The checks of a job's payload that every producer shares: the JSON text stored (an object,
within the size and depth limits, nothing PostgreSQL refuses), and whether a handler can be
called with it (``handler_arguments``: the CLI, ``eager()`` and the HTTP API when it knows the
app). Each refusal is an ``InvalidPayload`` naming the field at fault.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pgjobs.errors import InvalidPayload
from pgjobs.tasks import Task

#: Bytes of serialised JSON one payload may take; larger payloads are refused at enqueue.
#: Keep big blobs elsewhere (object storage) and enqueue a reference to them.
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

# Payloads as compact JSON; NaN and infinities are refused (JSON has no such numbers). One encoder
# for every call: json.dumps with options builds a new one each time (a third of its cost).
_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

#: Levels of nested objects and arrays a payload may have. Python's json module recurses once per
#: level (about 1,000 levels raise RecursionError, when encoding and when a worker decodes), and a
#: handler's arguments nested deeper than this are a mistake or an attack.
MAX_PAYLOAD_DEPTH = 100

# A surrogate escape as the encoder writes it (lowercase hex), when an even number of backslashes
# precedes it: a high one not followed by a low one, or a low one not preceded by a high one.
# jsonb refuses such lone surrogates; a pair is a character outside the BMP and fine.
_LONE_SURROGATE_ESCAPE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2})"
)


def handler_arguments(task: Task, payload: Any) -> dict[str, Any]:
    """The keyword arguments ``task``'s handler is called with for ``payload`` (a decoded JSON
    object, as a worker reads it back): its keys bound to the handler's parameters (a key it
    does not take is refused), their types checked, or the model built. Raises
    ``InvalidPayload`` naming the field at fault when the handler could not be called with it.
    Enqueue itself checks less (the values' types): ``eager``, the CLI's enqueue and the HTTP
    API (with the app known) check this.

    Example: ``handler_arguments(app.tasks["emails.welcome"], {"user_id": 42})``
    """
    problem = task.payload_problem(payload)
    if problem is not None:
        raise InvalidPayload(problem.message, field=problem.field)
    arguments, why = task.arguments(payload)
    if why is not None:
        raise InvalidPayload(why, field="payload")
    return arguments


def payload_text(given: Any, task: Task | None) -> str:
    """The payload as the JSON text to store, checked: a JSON object (an instance of a typed
    handler's model stands for its fields) that fits a typed handler, within the limits."""
    payload = {} if given is None else given
    if task is not None and task.model is not None and isinstance(payload, task.model.cls):
        payload = task.model.dump(payload)  # an instance of the handler's model: its fields
    if not isinstance(payload, dict):
        raise InvalidPayload(
            f"payload must be a JSON object (a dict), got {type(payload).__name__}", field="payload"
        )
    if task is not None and (task.types is not None or task.model is not None):
        # A typed handler's values are checked before they are stored; which keys it takes is
        # checked by the worker (an untyped handler's too), as it always was.
        problem = task.payload_problem(payload, complete=False)
        if problem is not None:
            raise InvalidPayload(problem.message, field=problem.field)
    text = _encode(payload)
    if len(text) > MAX_PAYLOAD_BYTES and len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidPayload(
            f"payload is {len(text.encode()):,} bytes; the limit is {MAX_PAYLOAD_BYTES:,} "
            "(store large data elsewhere and enqueue a reference)",
            field="payload",
        )
    # The encoder escapes NUL as \u0000 (ASCII output), which jsonb refuses; an escape is real
    # when an even number of backslashes precedes it. The substring test spares most payloads
    # the regular expression.
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidPayload(
            "payload contains a NUL character (\\u0000), which PostgreSQL refuses", field="payload"
        )
    if "\\ud" in text and _LONE_SURROGATE_ESCAPE.search(text):
        raise InvalidPayload(
            "payload contains a lone surrogate (text that is not valid UTF-8), which PostgreSQL "
            "refuses",
            field="payload",
        )
    return text


def _encode(payload: dict[str, Any]) -> str:
    """``payload`` as compact JSON, or ``InvalidPayload`` naming why it cannot be."""
    try:
        text = _JSON.encode(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}", field="payload") from None
    except RecursionError:
        text = None  # nested far too deep: _depth says how deep, without recursing
    # Only text with enough brackets can nest too deep; counting them is cheap, walking is not.
    brackets = MAX_PAYLOAD_DEPTH + 1 if text is None else text.count("[") + text.count("{")
    if brackets > MAX_PAYLOAD_DEPTH and _depth(payload) > MAX_PAYLOAD_DEPTH:
        raise InvalidPayload(
            f"payload nests objects and arrays more than {MAX_PAYLOAD_DEPTH} levels deep; "
            f"the limit is {MAX_PAYLOAD_DEPTH}",
            field="payload",
        )
    if text is None:  # the recursion limit was reached for another reason than depth
        raise InvalidPayload("payload is too deeply nested to serialise as JSON", field="payload")
    return text


def _depth(value: object) -> int:
    """Levels of dicts and lists in ``value`` (iteratively, so any depth can be measured); stops
    counting a little past ``MAX_PAYLOAD_DEPTH``, and at a cycle."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    seen: set[int] = set()
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        deepest = max(deepest, level)
        if level > MAX_PAYLOAD_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest
