"""Tags: labels a job carries through the three tables ("customer:42", "import:7"), for triage.

A job is enqueued with ``tags=[...]``; they are stored in the ``tags`` column (text[], NULL for
a job without tags), copied by every move, kept by a redrive and by a replay, and searched with
``tags @> ARRAY[...]`` (every tag asked for), which the partial GIN indexes ``ix_<table>_tags``
serve. Jobs without tags keep the statements they always had: only a call in which some job has
tags takes the tagged statements below (``queries.JOB_*_TAGGED``).

The bounds: at most ``MAX_TAGS`` distinct tags per job, each 1..``MAX_TAG_LENGTH`` characters of
visible text without a space at either end, in Unicode's composed form (NFC, as names are, so a
filter typed either way finds them); duplicates are dropped, the first kept in place.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from typing import Protocol

from pgjobs.errors import ConfigurationError
from pgjobs.submission import check_visible

#: Distinct tags one job may carry: labels to search by, not a place for data (the payload is).
MAX_TAGS = 20
#: Characters in one tag: room for "customer:<uuid>" and the like, short enough to show in a list.
MAX_TAG_LENGTH = 100

Tags = tuple[str, ...]


class Tagged(Protocol):
    """What the tagged statements read of a job (``enqueue.PreparedJob``)."""

    @property
    def tags(self) -> Tags | None: ...


def check(tags: object, field: str = "tags") -> Tags | None:
    """``tags`` checked: a list or tuple of strings (a bare string is refused, never split into
    characters), each ``check_tag``, duplicates dropped keeping the first; None for no tags
    (None or an empty list). Raises a ``ConfigurationError`` naming ``field``.

    Example: ``check(["customer:42", "import:7", "customer:42"])`` returns
    ``("customer:42", "import:7")``.
    """
    if tags is None:
        return None
    if not isinstance(tags, list | tuple):
        kind = "a string" if isinstance(tags, str | bytes) else type(tags).__name__
        raise ConfigurationError(
            f"{field} must be a list of strings, got {kind}"
            + (f" (write [{tags!r}] for one tag)" if isinstance(tags, str) else ""),
            field=field,
        )
    if not tags:
        return None
    kept: dict[str, None] = {}
    for position, tag in enumerate(tags):
        kept.setdefault(check_tag(tag, f"{field}[{position}]"))
        if len(kept) > MAX_TAGS:
            raise ConfigurationError(
                f"{field}: more than {MAX_TAGS} distinct tags; the limit is {MAX_TAGS}",
                field=field,
            )
    return tuple(kept)


def check_tag(tag: object, field: str = "tag") -> str:
    """One tag, checked (see the module's bounds) and in NFC: what a job stores and what a
    filter compares with.

    Example: ``check_tag("customer:42")`` returns ``"customer:42"``.
    """
    if not isinstance(tag, str):
        raise ConfigurationError(f"{field} must be a string, got {type(tag).__name__}", field=field)
    if not tag:
        raise ConfigurationError(
            f"{field} is empty; a tag has 1..{MAX_TAG_LENGTH} characters", field=field
        )
    if "\x00" in tag:
        raise ConfigurationError(
            f"{field} holds a NUL character, which PostgreSQL refuses", field=field
        )
    if not tag.isascii() or not tag.isprintable():
        try:
            check_visible(field, tag, field=field)
        except ConfigurationError as exc:
            raise ConfigurationError(str(exc), field=field) from None
        tag = unicodedata.normalize("NFC", tag)
    if len(tag) > MAX_TAG_LENGTH:
        raise ConfigurationError(
            f"{field} is {len(tag):,} characters long; the limit is {MAX_TAG_LENGTH}",
            field=field,
        )
    if tag[0] == " " or tag[-1] == " ":
        raise ConfigurationError(
            f"{field} {tag!r} begins or ends with a space, which cannot be seen; remove it",
            field=field,
        )
    return tag


def check_filter(tags: Sequence[str] | None, field: str = "tag") -> list[str] | None:
    """Tags to filter by (every one of them: ``tags @> ARRAY[...]``), checked as a job's are;
    None (no filter) for none.

    Example: ``check_filter(["customer:42"])`` returns ``["customer:42"]``.
    """
    if tags is None or (isinstance(tags, list | tuple) and not tags):
        return None
    checked = check(tags, field)
    return None if checked is None else list(checked)


def tagged(rows: Sequence[Tagged]) -> bool:
    """Whether one of ``rows`` has tags: only then does an insert take a tagged statement."""
    return any(row.tags is not None for row in rows)


def column(rows: Sequence[Tagged]) -> list[str | None]:
    """The ``tags`` parameter of the tagged unnest inserts: each row's tags as a JSON array (an
    array of arrays cannot be unnested row by row), None for a row without."""
    return [None if row.tags is None else json.dumps(row.tags) for row in rows]
