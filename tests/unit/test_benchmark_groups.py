"""Benchmark group m (``python -m benchmarks --only groups``) is registered and builds the
workload its rows describe; the measurements themselves need a database and worker processes
(``make bench``)."""

from __future__ import annotations

from collections import Counter
from itertools import groupby

from benchmarks import QUEUE, groups
from benchmarks.cli import GROUPS, _parse
from benchmarks.harness import Context
from benchmarks.tasks import GROUP_CONCURRENCY, grouped_app


def test_the_group_is_chosen_by_its_name_and_its_letter():
    assert GROUPS["groups"] == ("m", groups.run)
    assert _parse(["--only", "groups"]).groups == ["groups"]
    assert _parse(["--only", "m"]).groups == ["groups"]


def test_a_full_run_has_the_sizes_the_rows_name():
    full = groups.Sizes.of(Context(None, False, 5, None))  # type: ignore[arg-type]
    assert (full.groups, full.per_group, full.backlog) == (1_000, 20, 50_000)
    quick = groups.Sizes.of(Context(None, True, 2, None))  # type: ignore[arg-type]
    assert quick.groups * quick.per_group < full.groups * full.per_group


def test_the_throughput_workload_is_1000_groups_of_20_jobs_enqueued_group_after_group():
    jobs = list(groups.workload(1_000, 20, grouped=True))
    assert len(jobs) == 20_000
    assert {(job.task, job.queue) for job in jobs} == {("bench.grouped", QUEUE)}
    runs = [(group, len(list(run))) for group, run in groupby(job.group for job in jobs)]
    assert len(runs) == 1_000 and {size for _, size in runs} == {20}
    assert len({group for group, _ in runs}) == 1_000


def test_the_reference_workload_is_the_same_jobs_without_groups():
    grouped = list(groups.workload(1_000, 20, grouped=True))
    plain = list(groups.workload(1_000, 20, grouped=False))
    assert [job._replace(group=None) for job in grouped] == plain
    assert {job.group for job in plain} == {None}


def test_the_fairness_backlog_is_one_group_and_each_newcomer_a_group_of_its_own():
    assert Counter(job.group for job in groups.backlog(50_000, grouped=True)) == {
        groups.BIG_GROUP: 50_000
    }
    assert Counter(job.group for job in groups.backlog(10, grouped=False)) == {None: 10}
    newcomers = [job.group for job in groups.newcomers(200, grouped=True)]
    assert len(set(newcomers)) == 200 and groups.BIG_GROUP not in newcomers
    assert {job.group for job in groups.newcomers(200, grouped=False)} == {None}


def test_the_workers_app_limits_each_group_of_the_grouped_task():
    tasks = grouped_app.tasks
    assert tasks["bench.grouped"].group_concurrency == GROUP_CONCURRENCY == 1
    assert tasks["bench.noop"].group_concurrency is None
    assert groups.APP == "benchmarks.tasks:grouped_app"
