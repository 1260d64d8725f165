"""Failover and switchover under Patroni: a cluster of two PostgreSQL 15 members and a one-member
etcd from Debian's packages (``tests/support/patroni.py``), in synchronous mode, with the failover
tests' producer and two `pgjobs work` processes on a multi-host DSN
(``target_session_attrs=read-write``). Patroni, not the test, decides and promotes.

- A failover: the leader's postmaster is killed (SIGKILL) mid-load; Patroni on that node sees it
  gone, gives up the leader lock (``primary_start_timeout: 0``) and the synchronous standby takes
  over.
- A switchover: ``patronictl switchover --force`` mid-load; the leader stops and follows the
  standby, which takes over.

Each asserts: no job whose enqueue returned is lost (RPO 0), each is in exactly one table and
ends archived (or dead-lettered, for an at-most-once job whose run's fate was unknown), no
at-most-once job ran twice, the same worker processes worked on after the outage, and processing
resumed within 10 s of the new leader's promotion. The figures (RPO, RTO, re-runs) are printed:
`pytest tests/acceptance/test_patroni.py -s`. Without the packages these tests skip, unless $CI
is set: then they fail.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.failover import Failover, Recovery, fail_over_under_load, report
from tests.support.patroni import Member, PatroniCluster, patroni_cluster

pytestmark = pytest.mark.slow


@dataclass
class PromotionWatch:
    """Polls one member, on a thread of its own, for the moment it leaves recovery (its
    promotion: it takes writes from then on)."""

    member: Member
    moment: float | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self.stopping.is_set():
            try:
                if conn is None:
                    conn = self.member.connect()
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                if row is not None and not row[0]:
                    self.moment = time.time()
                    break
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            self.stopping.wait(0.05)
        if conn is not None:
            conn.close()


@contextlib.contextmanager
def watching_promotion(member: Member) -> Iterator[PromotionWatch]:
    watch = PromotionWatch(member)
    thread = threading.Thread(target=watch.run, name=f"watch-{member.name}", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        watch.stopping.set()
        thread.join(10)


def promoted(watch: PromotionWatch, cluster: PatroniCluster, timeout: float = 60) -> float:
    """Wait (at most ``timeout`` s) for the watched member's promotion; its moment."""
    deadline = time.monotonic() + timeout
    while watch.moment is None:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{watch.member.name} not promoted after {timeout}s ({cluster.roles()}): "
                f"{cluster.logs()}"
            )
        time.sleep(0.05)
    return watch.moment


def run_with_patroni(runs_file: Path, kind: str) -> Failover:
    """The failover workload on a fresh Patroni cluster; ``kind`` is ``failover`` (the leader's
    postmaster killed) or ``switchover``. Asserts that the synchronous standby is the leader at
    the end."""
    with patroni_cluster() as cluster:
        leader, standby = cluster.wait_healthy()

        def outage() -> Recovery:
            with watching_promotion(standby) as watch:
                started = time.time()
                if kind == "failover":
                    leader.kill_postmaster()
                else:
                    cluster.switchover(leader, standby)
                return Recovery(started, promoted(watch, cluster), standby.connect)

        result = fail_over_under_load(
            cluster.dsn(),
            cluster.url(),
            runs_file,
            connect_primary=leader.connect,
            outage=outage,
            describe=cluster.logs,
        )
        roles = cluster.roles()
        assert roles.get(standby.name, ("", ""))[0] == "leader", (roles, cluster.logs())
    return result


def assert_nothing_lost(result: Failover) -> None:
    """The assertions shared by the failover and the switchover."""
    assert result.lost == [], "every enqueue that returned is on the new leader, its key intact"
    assert set(result.returned) <= set(result.where)
    many_elsewhere = set(result.returned_in("dead_letter", "failover.many")) | set(
        result.returned_in("queued_jobs", "failover.many")
    )
    assert many_elsewhere == set(), "every at-least-once job ends archived"
    assert result.returned_in("queued_jobs", "failover.once") == []
    # An at-most-once job is dead-lettered, not run, when its claim committed but the worker
    # never saw it: allowed (and reported); run twice: never.
    assert result.ran_twice("failover.once") == []
    archived = {i for i, table in result.where.items() if table == "archived_jobs"}
    never_ran = [
        i
        for i in archived
        if result.runs[(result.tasks[i], result.keys[i])] == 0 and i in result.returned
    ]
    assert never_ran == [], "an archived job ran at least once"
    assert result.resume_seconds < 10, "processing resumes within 10 s of the promotion"


def test_failover_when_the_leaders_postmaster_is_killed(runs_file):
    result = run_with_patroni(runs_file, "failover")
    report("Patroni failover (leader's postmaster killed)", result)
    assert_nothing_lost(result)


def test_switchover_under_load(runs_file):
    result = run_with_patroni(runs_file, "switchover")
    report("Patroni switchover (patronictl switchover --force)", result)
    assert_nothing_lost(result)
