# Fairness and uniqueness: a limit per group, an ordered task, debounce and throttle.
# tests/integration/docs/test_doc_snippets.py declares these tasks and enqueues their jobs.
import pgjobs

app = pgjobs.App()


@app.task(name="reports.build", group_concurrency=2)  # at most 2 of one customer's at once
def build(report: int) -> None: ...


@app.task(name="ledger.apply", ordered=True)  # one job of a group at a time, in enqueue order
def apply(entry: int) -> None: ...


@app.task(name="search.reindex", debounce=5)  # on_conflict="debounce" waits 5 s by default
def reindex(item: int) -> None: ...


@app.task(name="digest.send", throttle=60)  # at most one start per unique key per minute
def digest(user: int) -> None: ...
