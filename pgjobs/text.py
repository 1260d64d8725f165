"""Text rules that more than one surface shares, without rich or any web library: what a
terminal or a page can show of job data, and what PostgreSQL can store."""

from __future__ import annotations

import re

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
