"""How pgjobs prints an error or a warning: one line on stderr (without rich, so that every
command can say it before importing anything heavier)."""

from __future__ import annotations

import sys

from pgjobs.text import printable


def error(message: str) -> None:
    """An error as pgjobs prints every error: one line on stderr."""
    print(f"pgjobs: error: {printable(' '.join(message.split()))}", file=sys.stderr)


def warning(message: str) -> None:
    """A warning: one line on stderr, the command's work done all the same."""
    print(f"pgjobs: warning: {printable(' '.join(message.split()))}", file=sys.stderr)
