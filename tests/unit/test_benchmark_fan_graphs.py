"""The fan-out/fan-in row of benchmark group o (``python -m benchmarks --only workflows``) builds
the graphs it names; the measurement itself needs a database and worker processes."""

from __future__ import annotations

from benchmarks import QUEUE, workflows
from benchmarks.tasks import FAN_IN, app
from pgjobs import Ref


def test_each_graph_is_a_root_its_width_after_it_and_a_join_after_all_of_those():
    specs = workflows.fan_specs(3, 4)
    assert len(specs) == 3 * (4 + 2)
    assert {(spec.task, spec.queue) for spec in specs} == {("bench.noop", QUEUE)}
    for graph in range(3):
        root = graph * 6
        assert not specs[root].after
        assert [list(spec.after or []) for spec in specs[root + 1 : root + 5]] == [[Ref(root)]] * 4
        assert list(specs[root + 5].after or []) == [Ref(root + 1 + n) for n in range(4)]


def test_the_batch_form_is_a_root_task_whose_batch_callback_is_the_join():
    assert "bench.fan_out" in app.tasks
    assert (FAN_IN.task, FAN_IN.queue) == ("bench.noop", QUEUE)
