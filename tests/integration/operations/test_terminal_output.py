"""Terminal output is not a control channel: job data (task and queue names, errors, tracebacks,
payloads, worker names) shown by `pgjobs dead list/show/group` and `pgjobs job show` has its
control characters escaped (ESC shows as ``\\x1b``); `dead list --json` carries tracebacks."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.admin_factories import bury
from tests.support.helpers import run

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")

#: Clear the screen, retitle the terminal, a CSI as one C1 byte, a right-to-left override.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil"
#: What must not reach the terminal: C0 controls but newline and tab (the separator of piped
#: rows; a tab in job data is escaped: test_dead_listing), DEL, C1, bidi overrides.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def hostile_dead_job(conn) -> int:
    [job_id] = bury(
        conn,
        1,
        task=f"t{HOSTILE}",
        queue=f"q{HOSTILE}",
        error=lambda n: f"boom{HOSTILE}\r\nsecond line\x1b[1A",
    )
    conn.execute(
        "UPDATE dead_letter SET payload = jsonb_build_object('text', %s::text), worker = %s "
        "WHERE id = %s",
        [f"p{HOSTILE}", f"w{HOSTILE}", job_id],
    )
    return job_id


@pytest.mark.parametrize(
    "argv", [["dead", "list"], ["dead", "show", "{id}"], ["dead", "group"], ["job", "show", "{id}"]]
)
def test_job_data_cannot_drive_the_terminal(capsys, dsn, hostile_dead_job, argv):
    argv = [arg.format(id=hostile_dead_job) for arg in argv]
    code, out, err = run(capsys, *argv, "--dsn", dsn.url)
    assert code == 0, err
    assert RAW_CONTROL.findall(out) == [], out
    assert "\\x1b[2J" in out  # shown, as an escape
    if argv[1] == "show":
        assert "\\x1b]0;owned\\x07\\x9b31m\\u202eevil" in out
        assert "second line" in out


def test_dead_list_json_carries_the_traceback_dead_show_shows(capsys, dsn, hostile_dead_job):
    code, out, err = run(capsys, "dead", "list", "--json", "--dsn", dsn.url)
    assert code == 0, err
    assert RAW_CONTROL.findall(out) == []  # JSON escapes them itself
    [listed] = json.loads(out)
    code, out, err = run(capsys, "dead", "show", str(hostile_dead_job), "--json", "--dsn", dsn.url)
    assert code == 0, err
    shown = json.loads(out)
    assert listed["traceback"] == shown["traceback"]
    assert listed["traceback"].startswith("Traceback (most recent call last):\nboom\x1b[2J")
    assert listed == shown
