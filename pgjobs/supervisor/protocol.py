"""What a worker process and its supervisor say to each other over their socket pair: the
database (``dsn [url, source]``) one way, ``ready`` or ``failed CODE MESSAGE`` the other, and the
slot a fresh interpreter learns from its environment."""

from __future__ import annotations

import json

from pgjobs.db.dsn import Dsn

#: The environment variable that tells a worker process started as a fresh interpreter its
#: slot: 0..N-1, the same for the process that replaces it (`--http` adds it to the port).
SLOT_ENV = "PGJOBS_SUPERVISOR_SLOT"
#: The supervisor's first line: ``dsn [url, source]``.
DSN_WORD = b"dsn"
#: A worker process passed its start-up checks.
READY = b"ready\n"
#: A worker process could not start: ``failed CODE MESSAGE``.
FAILED = b"failed"
#: Longest line a worker process may say (an error message is one line, far shorter).
LONGEST_LINE = 64 * 1024


def hello(dsn: Dsn) -> bytes:
    """The supervisor's first line to a worker process: the database it hands over.

    Example: ``read_dsn(hello(dsn).rstrip()) == dsn``
    """
    return b"%s %s\n" % (DSN_WORD, json.dumps([dsn.url, dsn.source]).encode())


def read_dsn(line: bytes) -> Dsn | None:
    """The database in the supervisor's first line, ``dsn [url, source]``; None for another
    line."""
    word, _, rest = line.partition(b" ")
    try:
        url, source = json.loads(rest) if word == DSN_WORD else (None, None)
    except (TypeError, ValueError):
        return None
    if not isinstance(url, str) or not isinstance(source, str):
        return None
    return Dsn(url, source)
