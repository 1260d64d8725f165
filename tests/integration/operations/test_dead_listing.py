"""`pgjobs dead list` and `dead group` stay readable at 80 columns: two lines a row at a terminal
(names cropped at the line's end, never folded; the error shortened at a word), and one
tab-separated line a row into a pipe, names whole (the title and count as ``#`` lines)."""

from __future__ import annotations

import io
import itertools
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from pgjobs import admin
from pgjobs.cli import render_dead
from pgjobs.cli.render_dead import shorten
from tests.support.admin_factories import bury
from tests.support.helpers import REPO, pgjobs_command, pgjobs_env

LONG_TASK = "billing.invoices.generate_monthly_statement_for_enterprise_customers_v2"
LONG_QUEUE = "billing-enterprise-statements-eu-west"
LONG_ERROR = (
    "psycopg.errors.SerializationFailure: could not serialize access due to concurrent update "
    "while generating the statement for customer 1234 in the billing run of November"
)


@pytest.fixture
def long_dead(conn) -> list[int]:
    return bury(conn, 3, task=LONG_TASK, queue=LONG_QUEUE, error=lambda n: f"{LONG_ERROR} #{n}")


def terminal(width: int = 80) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=True, color_system=None), out


def test_dead_list_at_80_columns_takes_two_lines_a_job(dsn, long_dead):
    console, out = terminal()
    render_dead.dead_jobs(console, admin.dead_jobs(dsn, admin.DeadFilter(), limit=50), 50)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    rows = [n for n, line in enumerate(lines[:-1]) if line.lstrip().split(" ")[0].isdigit()]
    assert [lines[n].split()[0] for n in rows] == [str(i) for i in sorted(long_dead, reverse=True)]
    # A job: its fields on one line, its error on the next; nothing else until the next job.
    assert [b - a for a, b in itertools.pairwise(rows)] == [2, 2]
    for n in rows:
        assert LONG_QUEUE in lines[n]
        assert lines[n].rstrip().endswith("…")  # the task cropped at the end, not folded
        assert "generate_monthly" not in lines[n + 1]
        error = lines[n + 1].strip()
        kept = error.removesuffix("…")
        assert error.endswith("…") and LONG_ERROR.startswith(kept)
        assert LONG_ERROR[len(kept)] == " ", "cut at a word, not mid-word"


def test_dead_group_at_80_columns_takes_two_lines_a_group(dsn, conn, long_dead):
    bury(conn, 2, task="images.resize", error=lambda n: "ValueError: image is corrupt")
    console, out = terminal()
    groups = admin.dead_groups(dsn, admin.DeadFilter())
    render_dead.dead_groups(console, groups, "dead jobs by task and error")
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    rows = [n for n, line in enumerate(lines[:-1]) if line.lstrip().split(" ")[0].isdigit()]
    assert len(rows) == len(groups) == 2
    assert [b - a for a, b in itertools.pairwise(rows)] == [2]
    assert "images.resize" in lines[rows[1]]
    assert lines[rows[1] + 1].strip() == "ValueError: image is corrupt"


@pytest.mark.parametrize(("argv", "fields"), [(["dead", "list"], 7), (["dead", "group"], 6)])
def test_piped_output_is_one_whole_line_a_row(dsn, long_dead, argv, fields):
    env = pgjobs_env(dsn.url)
    env["COLUMNS"] = "80"
    done = subprocess.run(
        pgjobs_command(*argv), env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    header, *rows = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert len(header.split("\t")) == fields
    assert len(rows) == (3 if argv[1] == "list" else 1)
    for row in rows:
        cells = row.split("\t")
        assert len(cells) == fields
        assert LONG_TASK in cells
        assert any("update while generating the statement for customer" in c for c in cells)


def test_a_tab_or_newline_in_job_data_cannot_make_a_field_or_a_line(dsn, conn):
    bury(conn, 1, task="t\tx", queue="q\nfake", error=lambda n: "one\ttwo\nthree")
    env = pgjobs_env(dsn.url)
    done = subprocess.run(
        pgjobs_command("dead", "list"),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    _, row = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert len(row.split("\t")) == 7


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=120),
    width=st.integers(min_value=1, max_value=90),
)
def test_shorten_fits_and_keeps_a_prefix(text, width):
    short = shorten(text, width)
    assert Text(short).cell_len <= width
    if short != text:
        assert short.endswith("…")
        assert text.startswith(short.removesuffix("…").rstrip()) or width == 1
