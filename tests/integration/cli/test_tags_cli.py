"""Tags on the command line: `pgjobs enqueue --tag`, shown by `pgjobs job show` (and --json), and
`pgjobs dead list/group/redrive --tag` (repeated: the jobs carrying every one); bad tags exit 2
with one line and write nothing."""

from __future__ import annotations

import json

import pytest

from tests.support.admin_factories import bury
from tests.support.factories import counts
from tests.support.helpers import assert_one_line_error, run, scalar

pytestmark = pytest.mark.usefixtures("no_dsn_in_env")


def test_enqueue_with_tags_and_job_show(capsys, conn, dsn):
    code, out, err = run(
        capsys, "enqueue", "t.send", "--tag", "customer:42", "--tag", "import:7", "--dsn", dsn.url
    )
    assert code == 0, err
    job_id = int(out)
    assert scalar(conn, "SELECT tags FROM queued_jobs WHERE id = %s", [job_id]) == [
        "customer:42",
        "import:7",
    ]
    code, out, _ = run(capsys, "job", "show", str(job_id), "--dsn", dsn.url)
    assert code == 0
    assert "customer:42, import:7" in out
    code, out, _ = run(capsys, "job", "show", str(job_id), "--json", "--dsn", dsn.url)
    assert json.loads(out)["tags"] == ["customer:42", "import:7"]
    code, out, _ = run(capsys, "enqueue", "t.send", "--dsn", dsn.url)
    code, out, _ = run(capsys, "job", "show", out.strip(), "--json", "--dsn", dsn.url)
    assert json.loads(out)["tags"] == []


@pytest.mark.parametrize(
    ("tag", "words"),
    [("", "empty"), ("x" * 101, "limit is 100"), ("a\tb", "control character")],
    ids=["empty", "too-long", "tab"],
)
def test_a_bad_tag_exits_2_and_writes_nothing(capsys, conn, dsn, tag, words):
    code, _, err = run(capsys, "enqueue", "t.send", "--tag", tag, "--dsn", dsn.url)
    assert code == 2
    assert_one_line_error(code, err, "--tag", words)
    assert counts(conn)["queued_jobs"] == 0


def test_dead_list_group_and_redrive_by_tag(capsys, conn, dsn):
    tagged = bury(conn, 3, task="fetch")
    other = bury(conn, 2, task="fetch")
    conn.execute(
        "UPDATE dead_letter SET tags = ARRAY['customer:42', 'import:7'] WHERE id = ANY(%s)",
        [tagged],
    )
    conn.execute("UPDATE dead_letter SET tags = ARRAY['customer:42'] WHERE id = ANY(%s)", [other])

    def listed(*tags: str) -> list[int]:
        argv = [arg for tag in tags for arg in ("--tag", tag)]
        code, out, err = run(capsys, "dead", "list", *argv, "--json", "--dsn", dsn.url)
        assert code == 0, err
        return sorted(job["id"] for job in json.loads(out))

    assert listed("customer:42") == sorted(tagged + other)
    assert listed("customer:42", "import:7") == tagged
    assert listed("import:7", "nope") == []
    code, out, _ = run(capsys, "dead", "show", str(tagged[0]), "--dsn", dsn.url)
    assert "customer:42, import:7" in out
    code, out, _ = run(capsys, "dead", "group", "--tag", "import:7", "--json", "--dsn", dsn.url)
    assert sum(group["count"] for group in json.loads(out)) == 3

    code, out, err = run(
        capsys, "dead", "redrive", "--tag", "import:7", "--tag", "customer:42", "--dsn", dsn.url
    )
    assert code == 0, err
    assert "redrove 3 dead job(s)" in out
    assert counts(conn)["dead_letter"] == 2
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE tags @> ARRAY['import:7']") == 3

    code, _, err = run(capsys, "dead", "redrive", "--tag", " x", "--dsn", dsn.url)
    assert_one_line_error(code, err, "space")
    assert code == 2
    assert counts(conn)["dead_letter"] == 2
