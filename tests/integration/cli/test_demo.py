"""`make demo` ends as the README says: of the image jobs, one in ten dead after its three
attempts, one in ten archived on its second attempt, the rest archived on their first; every
e-mail archived; and it ends by saying where the `pgjobs` it ran is, since it is not on the PATH."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from examples import demo
from pgjobs.db.dsn import Dsn
from pgjobs.models import ArchivedStatus, DeadReason
from tests.support.factories import insert_raw, work
from tests.support.helpers import REPO, scalar, wait_until


@pytest.fixture
def demo_app(dsn: Dsn):
    demo.app.bind(dsn)
    yield demo.app
    demo.app.close()


def test_the_demo_ends_as_the_readme_says(demo_app, conn):
    with demo_app:
        ids = demo_app.enqueue_many(demo.jobs(30))
    assert work(demo_app, concurrency=8) == 0

    dead = conn.execute("SELECT task, attempts, reason FROM dead_letter ORDER BY id").fetchall()
    assert dead == [("demo.resize", 3, DeadReason.EXHAUSTED)] * 3
    archived = conn.execute(
        "SELECT task, payload->>'fail', attempts, status FROM archived_jobs"
    ).fetchall()
    assert len(archived) + len(dead) == len(ids)
    assert {(task, fail, attempts) for task, fail, attempts, _ in archived} == {
        ("demo.resize", "once", 2),
        ("demo.resize", "never", 1),
        ("demo.send_email", None, 1),
    }
    assert {status for *_, status in archived} == {ArchivedStatus.SUCCEEDED}
    assert sum(task == "demo.send_email" for task, *_ in archived) == 10


def test_the_demo_run_again_ends_with_the_same_counts(demo_app, conn, capsys):
    """`make demo` twice: its enqueue (--fresh) first removes what the first run left, in each
    of the three tables, so the second ends with the README's counts too; jobs of other tasks
    in the database stay."""
    other = insert_raw(conn, "shop.welcome", queue="elsewhere")
    counts = []
    for _ in range(2):
        demo.enqueue(30, fresh=True)
        assert work(demo_app, concurrency=8) == 0
        counts.append(
            [
                scalar(conn, f"SELECT count(*) FROM {table} WHERE task LIKE 'demo.%'")
                for table in ("queued_jobs", "archived_jobs", "dead_letter")
            ]
        )
    assert counts == [[0, 37, 3]] * 2
    assert "removed 40 jobs an earlier demo left" in capsys.readouterr().out
    assert scalar(conn, "SELECT array_agg(id) FROM queued_jobs") == [other]


def test_the_demo_ends_by_saying_how_to_run_pgjobs():
    # A dry run prints the recipe (the venv is neither made nor used); the recursive make it ends
    # with is run even so, and prints the closing lines' commands. Run as a user runs it: not as a
    # make inside `make test`'s, which would print the directories it enters and leaves.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    dry = subprocess.run(
        ["make", "-n", "demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "pgjobs stats" in dry.stdout
    assert dry.stdout.rstrip().splitlines()[-2:] == [
        'echo "pgjobs is installed in .venv, not on your PATH: run .venv/bin/pgjobs'
        ' (e.g. .venv/bin/pgjobs dead group),"',
        'echo "or activate the venv first (source .venv/bin/activate) and run pgjobs."',
    ]
    said = subprocess.run(
        ["make", "-s", "demo-next"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert said.returncode == 0, said.stderr
    assert ".venv/bin/pgjobs" in said.stdout
    assert "source .venv/bin/activate" in said.stdout


def test_the_compose_producer_enqueues_a_batch_every_few_seconds_until_sigterm(
    conn, subprocess_env: dict[str, str]
):
    # docker-compose.yml's producer, as its container runs it (every 2 s there; faster here).
    command = [sys.executable, "-m", "examples.demo", "produce", "--every", "0.2", "--count", "5"]
    producer = subprocess.Popen(
        command, cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_until(
            lambda: (
                scalar(conn, "SELECT count(*) FROM queued_jobs WHERE task = 'demo.resize'") >= 15
            ),
            timeout=60,
            what="three batches",
        )
        producer.send_signal(signal.SIGTERM)
        out, err = producer.communicate(timeout=30)
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait(10)
    assert (producer.returncode, err) == (0, b"")
    lines = out.decode().splitlines()
    assert len(lines) >= 3 and all(line.startswith("batch ") for line in lines)
    images = conn.execute(
        "SELECT (payload->>'image')::int, payload->>'fail' FROM queued_jobs "
        "WHERE task = 'demo.resize' ORDER BY id"
    ).fetchall()
    assert [image for image, _ in images] == list(range(len(images))), "new images each batch"
    fails = [fail for _, fail in images[:10]]
    assert (fails.count("always"), fails.count("once")) == (1, 1), "a share of them fail"
    assert scalar(conn, "SELECT count(*) FROM queued_jobs WHERE task = 'demo.send_email'") > 0


@pytest.mark.parametrize(
    "args", [["produce", "--count", "0"], ["produce", "--every", "nan"], ["enqueue"], ["nope"]]
)
def test_the_demo_refuses_bad_arguments(args: list[str], subprocess_env: dict[str, str]):
    said = subprocess.run(
        [sys.executable, "-m", "examples.demo", *args],
        cwd=REPO,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert said.returncode == 2 and said.stderr.splitlines()[-1].startswith("python -m examples")
