"""The dashboard's inputs: filters from query strings and fields from posted forms, read into
pgjobs' own types so that the same validation as the CLI's and the API's applies
(``DeadFilter``, ``browse.jobs``, ``tasks.check_name``). Every bad value is a
``ConfigurationError`` naming the field; a page shows it beside the form and changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

from pgjobs.admin import DeadFilter
from pgjobs.errors import ConfigurationError
from pgjobs.models import DeadReason, JobStatus
from pgjobs.submission import check_name
from pgjobs.tags import check_filter
from pgjobs.text import age_of, is_age_shaped

#: Bytes a posted form may hold: a form of the dashboard is a few hundred.
MAX_FORM_BYTES = 64 * 1024
MAX_FORM_FIELDS = 50

#: Longest text search in errors.
_MAX_SEARCH = 1000
_FINGERPRINT_MAX = 1000

DEAD_FIELDS = ("queue", "task", "reason", "since", "until", "error", "fingerprint", "tag")
JOB_FIELDS = ("state", "queue", "task", "since", "until", "tag")


def parse_form(body: bytes) -> dict[str, str]:
    """A posted ``application/x-www-form-urlencoded`` body as fields (the last of a repeated
    name wins); ``ConfigurationError`` for one that is not UTF-8 or has too many fields."""
    try:
        text = body.decode("utf-8")
        pairs = parse_qsl(
            text, keep_blank_values=True, strict_parsing=False, max_num_fields=MAX_FORM_FIELDS
        )
    except (UnicodeDecodeError, ValueError):
        raise ConfigurationError("the form is not valid UTF-8 form data") from None
    return dict(pairs)


def _text(fields: Mapping[str, str], name: str) -> str | None:
    value = fields.get(name, "").strip()
    return value or None


def moment(name: str, value: str | None, now: datetime | None = None) -> datetime | None:
    """A moment of a filter: an age (``90m``, ``12h``, ``2d``: that long before now), or an ISO
    8601 time (a browser's ``datetime-local`` value has no timezone: UTC is meant).

    Example: ``moment("since", "2h")`` is two hours ago.
    """
    if value is None:
        return None
    if is_age_shaped(value):
        ago = age_of(value)
        if ago is None:
            raise ConfigurationError(
                f"{name} {value!r}: an age must be positive and at most 100 years", field=name
            )
        return (now or datetime.now(UTC)) - ago
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ConfigurationError(
            f"{name} {value!r}: expected an age such as 90m, 12h or 2d, or a time such as "
            "2026-11-21T15:00 (UTC unless it names a timezone)",
            field=name,
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _name(fields: Mapping[str, str], kind: str) -> str | None:
    value = _text(fields, kind)
    return None if value is None else check_name(kind, value)


def reason(value: str | None) -> DeadReason | None:
    if value is None:
        return None
    try:
        return DeadReason(value)
    except ValueError:
        known = ", ".join(r.value for r in DeadReason)
        raise ConfigurationError(f"unknown reason {value!r}: use {known}", field="reason") from None


@dataclass(frozen=True, slots=True)
class DeadQuery:
    """The dead-letter page's filters: ``pgjobs dead``'s, plus the reason."""

    where: DeadFilter
    reason: DeadReason | None
    #: The filters as the form had them (to show them again and build links).
    raw: dict[str, str]

    @property
    def narrowed(self) -> bool:
        return not self.where.matches_all or self.reason is not None

    def query_string(self, **extra: str) -> str:
        return urlencode({**self.raw, **extra})


def dead_query(fields: Mapping[str, str]) -> DeadQuery:
    """The dead-letter filters of a query string or form."""
    raw = {name: fields[name].strip() for name in DEAD_FIELDS if fields.get(name, "").strip()}
    error = _text(fields, "error")
    if error is not None and len(error) > _MAX_SEARCH:
        raise ConfigurationError(f"error search is longer than {_MAX_SEARCH}", field="error")
    fingerprint = _text(fields, "fingerprint")
    if fingerprint is not None and len(fingerprint) > _FINGERPRINT_MAX:
        raise ConfigurationError("fingerprint is too long", field="fingerprint")
    now = datetime.now(UTC)
    try:
        where = DeadFilter(
            queue=_name(fields, "queue"),
            task=_name(fields, "task"),
            since=moment("since", _text(fields, "since"), now),
            until=moment("until", _text(fields, "until"), now),
            error=error,
            fingerprint=fingerprint,
            tags=_tags(fields),
        )
    except ConfigurationError as exc:
        if exc.field is None and "since" in str(exc):
            raise ConfigurationError(str(exc), field="since") from None
        raise
    return DeadQuery(where, reason(_text(fields, "reason")), raw)


@dataclass(frozen=True, slots=True)
class JobQuery:
    """The jobs page's filters (``browse.jobs``' arguments)."""

    states: list[JobStatus] | None
    queue: str | None
    task: str | None
    since: datetime | None
    until: datetime | None
    raw: dict[str, str]
    #: The jobs carrying this tag (one, as the form has it), checked.
    tags: list[str] | None = None

    def query_string(self, **extra: str) -> str:
        return urlencode({**self.raw, **extra})


def job_query(fields: Mapping[str, str]) -> JobQuery:
    raw = {name: fields[name].strip() for name in JOB_FIELDS if fields.get(name, "").strip()}
    state = _text(fields, "state")
    states = None
    if state is not None:
        try:
            states = [JobStatus(state)]
        except ValueError:
            known = ", ".join(s.value for s in JobStatus)
            raise ConfigurationError(
                f"unknown state {state!r}: use {known}", field="state"
            ) from None
    now = datetime.now(UTC)
    return JobQuery(
        states,
        _name(fields, "queue"),
        _name(fields, "task"),
        moment("since", _text(fields, "since"), now),
        moment("until", _text(fields, "until"), now),
        raw,
        check_filter(_tags(fields), "tag"),
    )


def _tags(fields: Mapping[str, str]) -> tuple[str, ...] | None:
    """The ``tag`` field as the tags to filter by (None: no filter)."""
    value = _text(fields, "tag")
    return None if value is None else (value,)


def job_id(value: str | None) -> int | None:
    """A job id typed by a person, or None when the text is not one."""
    if value is None:
        return None
    text = value.strip().lstrip("#")
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    number = int(text)
    return number if 0 < number < 2**63 else None


def local_path(value: str | None, fallback: str = "/") -> str:
    """Where to go after logging in: a path of this site only (never ``//host`` or a URL)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return fallback
    if any(ord(c) < 0x20 for c in value):
        return fallback
    return value


#: The fields of a job page's edit form.
EDIT_FIELDS = ("priority", "run_at", "payload", "max_attempts", "tags")


def job_edit(fields: Mapping[str, str]) -> dict[str, Any]:
    """A job page's edit form as the keyword arguments of ``editing.edit``. The form shows the
    job's values: an empty number, time or payload leaves that field as it is; the tags field
    holds them comma-separated (emptied: the job loses its tags); a run time is ``now`` or an
    ISO 8601 time (without a timezone: UTC, as a browser's ``datetime-local`` sends it)."""
    options: dict[str, Any] = {}
    for name in ("priority", "max_attempts"):
        value = _text(fields, name)
        if value is not None:
            try:
                options[name] = int(value)
            except ValueError:
                raise ConfigurationError(
                    f"{name.replace('_', ' ')} must be a whole number, got {value!r}", field=name
                ) from None
    run_at = _text(fields, "run_at")
    if run_at is not None and run_at.lower() == "now":
        options["run_in"] = 0.0
    elif run_at is not None:
        try:
            moment_ = datetime.fromisoformat(run_at)
        except ValueError:
            raise ConfigurationError(
                f"run at must be now or an ISO 8601 time, got {run_at!r}", field="run_at"
            ) from None
        options["run_at"] = moment_ if moment_.tzinfo else moment_.replace(tzinfo=UTC)
    payload = _text(fields, "payload")
    if payload is not None:
        try:
            options["payload"] = json.loads(payload)
        except (ValueError, RecursionError) as exc:
            raise ConfigurationError(f"the payload is not JSON: {exc}", field="payload") from None
    if "tags" in fields:
        options["tags"] = [t.strip() for t in fields["tags"].split(",") if t.strip()]
    return options
