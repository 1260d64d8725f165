# Results flowing from job to job: an order ships once it is charged and its stock reserved, and
# reads both results by name; an import counts its files in a batch, and the callback adds up
# every member's result a page at a time.
# tests/integration/docs/test_results_flow_example.py enqueues these jobs and runs them.
import pgjobs

app = pgjobs.App()


@app.task(name="shop.charge")
def charge(order: int, cents: int) -> dict[str, str]:
    return {"receipt": f"rcpt-{order}-{cents}"}


@app.task(name="shop.reserve")
async def reserve(order: int) -> dict[str, int]:
    return {"shelf": order % 40}


@app.task(name="shop.ship")
def ship(order: int) -> str:
    results = pgjobs.current_job().dependency_results()  # one statement, every dependency
    receipt = results["charge"]["receipt"]  # by the name given at enqueue...
    shelf = results["reserve"]["shelf"]
    return f"order {order}: {receipt}, from shelf {shelf}"


@app.task(name="shop.ship_async")
async def ship_async(order: int) -> str:
    results = await pgjobs.current_job().dependency_results_async()  # async handlers await it
    return f"order {order}: {results['charge']['receipt']}"


def checkout(order: int, cents: int) -> int:
    """Charge and reserve at once; ship once both have succeeded, reading both results."""
    charged = app.enqueue("shop.charge", {"order": order, "cents": cents})
    reserved = app.enqueue("shop.reserve", {"order": order})
    return app.enqueue(
        "shop.ship", {"order": order}, after={"charge": charged, "reserve": reserved}
    )


@app.task(name="imports.count")
def count(path: str) -> dict[str, int]:
    if path.endswith(".bad"):
        raise pgjobs.NonRetryableError(f"{path} is not a CSV file")
    return {"rows": len(path)}


@app.task(name="imports.total")
def total(batch: dict[str, int]) -> dict[str, object]:
    rows, failed = 0, []
    for member in pgjobs.current_job().batch_results():  # a page at a time, in id order
        if member.succeeded:
            rows += member.result["rows"]
        else:
            failed.append(member.id)  # member.reason, member.last_error say why
    return {"rows": rows, "failed": failed}


def import_files(paths: list[str]) -> int:
    """One job per file, and the total once every file has ended."""
    with app.batch(on_complete="imports.total") as batch:
        for path in paths:
            batch.enqueue("imports.count", {"path": path})
    return batch.id
