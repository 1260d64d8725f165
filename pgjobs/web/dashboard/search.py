"""The dashboard's search: a job by id, idempotency key, unique key, tag or group, in any of the
three tables, through an index only (``queries`` names the index of each kind, and
tests/integration/schema/test_search_plans.py checks the plans).

The text is checked first, and a search that cannot name a job is refused with one line (the
page answers 422 and reads nothing): a NUL, or more than ``MAX_BYTES`` bytes (no key, group or
tag is longer). Quotes, ``%``, ``;`` and the like are only text: every value is a bound
parameter, and a LIKE pattern is never built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgjobs import db, queries
from pgjobs.errors import ConfigurationError
from pgjobs.submission import MAX_KEY_BYTES
from pgjobs.web.dashboard import forms

#: What a search may look for, by the value of its ``kind`` field, and how the page names it.
KINDS = {
    "any": "anything",
    "id": "id",
    "key": "idempotency key",
    "unique": "unique key",
    "tag": "tag",
    "group": "group",
}
#: The longest search, in UTF-8 bytes: a key or a group is at most this long, a tag shorter.
MAX_BYTES = MAX_KEY_BYTES
#: Jobs a search finds at most, per kind (the newest).
LIMIT = 50

_QUERIES = {
    "unique": queries.SEARCH_BY_UNIQUE_KEY,
    "tag": queries.SEARCH_BY_TAG,
    "group": queries.SEARCH_BY_GROUP,
}


@dataclass(frozen=True, slots=True)
class Found:
    """The jobs a search found, newest first, and by what each was found."""

    ids: list[int]
    by: dict[int, list[str]] = field(default_factory=dict)


def check(text: str, kind: str) -> tuple[str, str]:
    """The search as it will run (``text`` without spaces at its ends), or ``ConfigurationError``
    with one line saying why it cannot name a job."""
    if kind not in KINDS:
        raise ConfigurationError(
            f"no kind of search {kind[:40]!r}: use one of {', '.join(KINDS)}", field="kind"
        )
    if "\x00" in text:
        raise ConfigurationError("a search may not hold a NUL character", field="find")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise ConfigurationError(
            f"a search is at most {MAX_BYTES} bytes long (no key, group or tag is longer); "
            f"this one is {size:,}",
            field="find",
        )
    text = text.strip()
    if not text:
        raise ConfigurationError(
            "type a job id, an idempotency or unique key, a tag or a group to search for",
            field="find",
        )
    return text, kind


def find(conn: psycopg.Connection[Any], text: str, kind: str = "any") -> Found:
    """The jobs ``text`` names as ``kind`` (every kind for "any"), at most ``LIMIT`` of each;
    ``check`` first (a refused search reads nothing).

    Example: ``search.find(conn, "customer:42", "tag").ids``
    """
    text, kind = check(text, kind)
    kinds = [k for k in KINDS if k != "any"] if kind == "any" else [kind]
    by: dict[int, list[str]] = {}
    for each in kinds:
        for job_id in _find(conn, text, each):
            by.setdefault(job_id, []).append(KINDS[each])
    return Found(sorted(by, reverse=True), by)


def _find(conn: psycopg.Connection[Any], text: str, kind: str) -> list[int]:
    if kind == "id":
        number = forms.job_id(text)
        if number is None:
            return []
        rows = db.fetch_all(conn, queries.SEARCH_BY_ID, {"id": number})
        return [int(row[0]) for row in rows]
    if kind == "key":
        rows = db.fetch_all(conn, queries.JOB_IDS_BY_KEY, {"key": text, "limit": LIMIT})
    else:
        rows = db.fetch_all(conn, _QUERIES[kind], {"value": text, "limit": LIMIT})
    return [int(row[0]) for row in rows]
