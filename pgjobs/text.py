"""Text rules that more than one surface shares, without rich or any web library: what a
terminal or a page can show of job data, and what PostgreSQL can store. It imports nothing from
pgjobs, so that every layer may use it."""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

# -- What a terminal or a page can show ----------------------------------------------------------

# Characters that act rather than show: C0 controls (ESC, CR, BS, ...), DEL, C1 controls, line
# and paragraph separators, bidirectional overrides and isolates, and lone surrogates (which
# cannot be encoded at all). Each is written as an escape instead.
_ACTING = r"\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_ESCAPED_ON_ONE_LINE = re.compile(rf"[\x00-\x1f{_ACTING}]")
_ESCAPED_ON_MANY_LINES = re.compile(rf"[\x00-\x09\x0b-\x1f{_ACTING}]")


def _as_escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, multiline: bool = False) -> str:
    """``text`` (job data: names, errors, payloads) safe to show on a terminal or a page: every
    character that would act rather than show written as an escape, ``\\x1b`` for ESC, so that a
    newline cannot fake a second line and a bidirectional override cannot reverse what follows
    it. Newlines are kept when ``multiline``; None becomes "". HTML is left to the page's
    autoescaping, rich markup to the caller.

    Example: ``printable("red\\x1b[31m") == "red\\\\x1b[31m"``
    """
    if text is None:
        return ""
    value = text if isinstance(text, str) else str(text)
    pattern = _ESCAPED_ON_MANY_LINES if multiline else _ESCAPED_ON_ONE_LINE
    return pattern.sub(_as_escape, value)


#: The most of one value (a payload, a result, a traceback) a page or a terminal shows, in bytes
#: of UTF-8; the API and ``--json`` give the whole.
SHOWN_BYTES = 64 * 1024


def clipped(text: str, limit: int = SHOWN_BYTES) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (never inside a character), with a note
    saying how much more there is and where to get the whole; unchanged when it fits.

    Example: ``clipped("é" * 3, 4)`` is ``"éé … (2 bytes more: ..."``
    """
    if len(text) <= limit // 4:  # 4 bytes a character at most: fits, without encoding it
        return text
    data = text.encode(errors="surrogatepass")
    if len(data) <= limit:
        return text
    shown = data[:limit].decode(errors="ignore")
    more = len(data) - len(shown.encode(errors="surrogatepass"))
    return (
        f"{shown} … ({more:,} bytes more: the API's GET /api/v1/jobs/ID and "
        "`pgjobs job show ID --json` give the whole)"
    )


# -- What PostgreSQL can store ------------------------------------------------------------------

#: Longest error text kept in last_error (characters); the full traceback goes to dead_letter.
MAX_ERROR_LENGTH = 2000

#: Largest result stored, in bytes of JSON text, unless the worker says otherwise
#: (``WorkerConfig.max_result_bytes``): a larger one is stored as a note saying so. A result is
#: written in the worker's round trip, so one of tens of MB would delay every other outcome.
MAX_RESULT_BYTES = 1024 * 1024


def result_json(value: Any, limit: int = MAX_RESULT_BYTES) -> str | None:
    """A handler's return value as JSON text, or None. A value JSON has no form for (NaN) is
    stored as its ``str``; one ``json`` cannot encode at all (tuple keys, nesting too deep, a
    ``__str__`` that raises), or whose JSON is longer than ``limit`` bytes, as a note saying so:
    the job still succeeded.

    Example: ``result_json("x" * 100, limit=10)`` is a note: '"result not stored: ..."'
    """
    text = _result_json(value)
    # json.dumps' output is ASCII (ensure_ascii), so its length is its size in bytes.
    if text is not None and len(text) > limit:
        return json.dumps(
            f"result not stored: its JSON is {len(text):,} bytes, more than the {limit:,} a "
            "result may be (WorkerConfig.max_result_bytes)"
        )
    return text


def _result_json(value: Any) -> str | None:
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str, allow_nan=False)
    except ValueError:
        text = _as_string(value)
    except BaseException as exc:  # whatever encoding raised (even SystemExit) is reported
        text = _unstorable(exc)
    if "\\ud" in text:
        text = _LONE_SURROGATE_ESCAPE_TO_REPLACE.sub(_keep_escape_or_replace, text)
    # jsonb refuses the NUL character; store U+FFFD in its place.
    return text.replace("\\u0000", "\\ufffd") if "\\u0000" in text else text


def _as_string(value: Any) -> str:
    try:
        return json.dumps(str(value))
    except BaseException as exc:
        return _unstorable(exc)


def _unstorable(exc: BaseException) -> str:
    return json.dumps(f"result not stored: json cannot encode it ({error_text(exc)})")


# In json.dumps' ASCII output: an escaped backslash, a surrogate pair, or a lone surrogate, which
# jsonb refuses ("unsupported Unicode escape sequence"); the lone ones are replaced by U+FFFD.
# Backslashes are matched first so that an escape is never read from the middle of another.
_LONE_SURROGATE_ESCAPE_TO_REPLACE = re.compile(
    r"\\\\|\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}|\\ud[89a-f][0-9a-f]{2}"
)


def _keep_escape_or_replace(match: re.Match[str]) -> str:
    escape = match.group()
    return escape if len(escape) != 6 else "\\ufffd"


def error_text(exc: BaseException) -> str:
    """``exc`` as one line for last_error: type and message, at most ``MAX_ERROR_LENGTH``, and
    storable whatever the message holds (a ``__str__`` that raises, lone surrogates, NUL).

    Example: ``error_text(ValueError("no\nway")) == "ValueError: no way"``
    """
    return error_line(f"{type(exc).__name__}: {_message(exc)}")


def error_line(text: str) -> str:
    """``text`` as one storable line (its whitespace runs made one space) of at most
    ``MAX_ERROR_LENGTH`` characters, ending in "…" when cut."""
    line = storable(" ".join(text.split()))
    return line if len(line) <= MAX_ERROR_LENGTH else line[: MAX_ERROR_LENGTH - 1] + "…"


#: Longest traceback kept in dead_letter (characters): its beginning and its end, the middle
#: cut. A traceback goes in the worker's round trip, beside every other job's outcome.
MAX_TRACEBACK_LENGTH = 100_000


def traceback_text(exc: BaseException) -> str | None:
    """``exc``'s traceback as dead_letter stores it, at most ``MAX_TRACEBACK_LENGTH``
    characters; None when formatting it fails."""
    try:
        text = "".join(traceback.format_exception(exc))
    except BaseException:  # a hostile __str__ or __traceback__: the error line says enough
        return None
    if len(text) > MAX_TRACEBACK_LENGTH:
        half = MAX_TRACEBACK_LENGTH // 2 - 100
        cut = len(text) - 2 * half
        text = f"{text[:half]}\n… ({cut:,} characters cut) …\n{text[-half:]}"
    return storable(text)


def error_type(exc: BaseException) -> str:
    """``exc``'s class as dead_letter's error_type names it, ``module.QualifiedName``, whatever
    the class says of itself (a ``__module__`` that is not text is ``<unknown>``, as in a
    traceback).

    Example: ``error_type(ValueError()) == "builtins.ValueError"``
    """
    cls = type(exc)
    try:
        module = cls.__module__
    except BaseException:  # a metaclass' hostile property
        module = None
    name = f"{module if type(module) is str else '<unknown>'}.{cls.__qualname__}"
    return error_line(name)


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException as problem:  # a hostile __str__ (even one raising SystemExit)
        return (
            f"<the exception's message cannot be shown: its str() raised {type(problem).__name__}>"
        )


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL as ``\\x00``, lone surrogates (which UTF-8
    cannot encode) as ``\\udcxx``."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode()
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def progress_text(progress: object, when: Callable[[datetime], str]) -> str | None:
    """A job's progress (``current_job().progress``) in one line, the time it was reported
    written by ``when`` as the surface writes every time; None for none.

    Example: ``progress_text({"done": 40, "total": 100, "message": "resizing", "at": ...}, when)``
    is ``"40 of 100 (40%): resizing, at 2026-12-01 19:10:52 UTC"``
    """
    if not isinstance(progress, dict):
        return None if progress is None else printable(progress)
    done, total = progress.get("done"), progress.get("total")
    line = f"{done}"
    if total is not None:
        line += f" of {total}"
        if isinstance(done, int | float) and isinstance(total, int | float) and total > 0:
            line += f" ({done / total:.0%})"
    if progress.get("message"):
        line += f": {progress['message']}"
    line = printable(line)
    if progress.get("at"):
        line += f", at {progress_time(progress['at'], when)}"
    return line


def progress_time(at: object, when: Callable[[datetime], str]) -> str:
    """The time a progress was reported (its ``"at"``: ISO 8601 text with its offset, as pgjobs
    writes it) as ``when`` writes a time; anything else (a row pgjobs did not write) as it is.

    Example: ``progress_time("2026-12-01T19:10:52.5+00:00", render.when)`` is
    ``"2026-12-01 19:10:52 UTC"``
    """
    if isinstance(at, str):
        try:
            moment = datetime.fromisoformat(at)
            if moment.tzinfo is not None:
                return when(moment)
        except (ValueError, OverflowError):  # not a time, or one that UTC cannot hold
            pass
    return printable(at)


# -- Ages: how long ago, or how long to keep ------------------------------------------------------

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: The longest age taken (a century): longer ones are typing errors, and far longer ones do not
#: fit a timedelta or a date.
MAX_AGE = timedelta(days=36525)


def is_age_shaped(value: str) -> bool:
    """Whether ``value`` is written as an age (a number and a unit), in range or not, so that a
    caller can tell "not an age" from "an age out of range".

    Example: ``is_age_shaped("0d")`` and ``not is_age_shaped("soon")``
    """
    return _AGE.fullmatch(value.strip().lower()) is not None


def age_of(value: str) -> timedelta | None:
    """The positive age ``value`` writes as a number and a unit (``45s``, ``90m``, ``12h``,
    ``30d``, ``2w``; decimals allowed), at most ``MAX_AGE``; None for anything else (0, a
    negative number, no unit, past a century).

    Example: ``age_of("2w") == timedelta(days=14)`` and ``age_of("0d") is None``
    """
    found = _AGE.fullmatch(value.strip().lower())
    if found is None:
        return None
    seconds = float(found.group(1)) * _AGE_UNITS[found.group(2)]
    if not 0 < seconds <= MAX_AGE.total_seconds():
        return None
    return timedelta(seconds=seconds)
