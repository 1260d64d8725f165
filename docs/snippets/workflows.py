# Workflows and results: a chain, a graph in one call, a fan-out/fan-in batch, and a wait.
# tests/integration/docs/test_doc_snippets.py enqueues these jobs, runs them and waits for them.
import pgjobs
from pgjobs import JobSpec, Ref

app = pgjobs.App()


@app.task(name="etl.extract")
def extract(day: str) -> int:
    return len(day)  # the rows it extracted


@app.task(name="etl.load")
def load(day: str) -> str:
    return f"loaded {day}"


@app.task(name="etl.check", max_attempts=1)
def check(day: str) -> None:
    raise RuntimeError(f"no data for {day}")  # dead at once: its dependents die unrun


@app.task(name="reports.render")
def render(report: int, page: int) -> None: ...


@app.task(name="reports.summarise")  # the batch's callback: its payload gets a "batch" key
def summarise(report: int, batch: dict[str, int]) -> str:
    return f"report {report}: {batch['succeeded']} of {batch['total']} pages"


def chain(day: str) -> int:
    """A chain: load runs once extract has succeeded (and dies unrun if extract dies)."""
    first = app.enqueue("etl.extract", {"day": day})
    return app.enqueue("etl.load", {"day": day}, after=[first])


def week(days: list[str]) -> list[int]:
    """A graph in one transaction: an extract per day, then one load after all of them."""
    specs = [JobSpec("etl.extract", {"day": day}) for day in days]
    specs.append(JobSpec("etl.load", {"day": days[-1]}, after=[Ref(n) for n in range(len(days))]))
    return app.enqueue_many(specs)


def report(report_id: int, pages: int) -> int:
    """A fan-out/fan-in: one job per page, and the summary once every page has ended."""
    with app.batch(on_complete=("reports.summarise", {"report": report_id})) as batch:
        for page in range(pages):
            batch.enqueue("reports.render", {"report": report_id, "page": page})
    return batch.id
