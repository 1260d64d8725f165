"""A workflow's handler as a task's: ``workflow_handler`` wraps the user's function (its first
parameter the ``WorkflowContext``) at declaration time into one that takes the payload alone, as
every task's handler does, so that a worker runs it in its slots like any other. The wrapper
reads the run's history, passes the context, and checks at the end that the run reached every
recorded entry."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgjobs.context import current_job
from pgjobs.errors import ConfigurationError, PgjobsError, WorkflowError
from pgjobs.pools import Pools
from pgjobs.workflows.context import Run, WorkflowContext
from pgjobs.workflows.history import AsyncStore, Store
from pgjobs.workflows.policy import StepPolicy

if TYPE_CHECKING:
    from pgjobs.context import JobContext
    from pgjobs.tasks import Task

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def workflow_handler(
    fn: Callable[..., Any],
    pools: Callable[[], Pools],
    task: Callable[[], Task],
    app: Callable[[], Any] | None = None,
) -> Callable[..., Any]:
    """The task handler of workflow function ``fn``: called with the payload, it runs ``fn``
    with a ``WorkflowContext`` first. ``pools`` gives the app's pools, ``task`` the task made
    of the handler (its name, lease and retry policy: the default of its steps).

    Example: ``make_task(workflow_handler(checkout, lambda: app_pools, lambda: box[0]))``
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"a workflow needs a function with a signature, got {fn!r}"
        ) from None
    params = list(signature.parameters.values())
    if not params or params[0].kind not in _POSITIONAL:
        raise ConfigurationError(
            f"workflow {getattr(fn, '__qualname__', fn)!r}: its first parameter receives the "
            "pgjobs.WorkflowContext (def checkout(ctx: pgjobs.WorkflowContext, order_id: int))",
            field="fn",
        )

    def start(is_async: bool) -> tuple[Run, WorkflowContext]:
        declared = task()
        job = _running_job(declared.name)
        run = Run(job, declared.name, StepPolicy(retry=declared.retry), declared.lease)
        run.app = app() if app is not None else None
        store = AsyncStore(pools(), job.job) if is_async else Store(pools(), job.job)
        return run, WorkflowContext(run, store)

    handler: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def run_async(**payload: Any) -> Any:
            run, ctx = start(True)
            store = ctx._store
            assert isinstance(store, AsyncStore)
            run.history = await store.load()
            run.active = True
            try:
                result = await fn(ctx, **payload)
            finally:
                run.active = False
            run.finish()
            return result

        handler = run_async
    else:

        def run_sync(**payload: Any) -> Any:
            run, ctx = start(False)
            store = ctx._store
            assert isinstance(store, Store)
            run.history = store.load()
            run.active = True
            try:
                result = fn(ctx, **payload)
            finally:
                run.active = False
            run.finish()
            return result

        handler = run_sync
    functools.update_wrapper(handler, fn)
    # What the task checks payloads against: the parameters after the context.
    setattr(handler, "__signature__", signature.replace(parameters=params[1:]))  # noqa: B010
    return handler


def _running_job(name: str) -> JobContext:
    try:
        return current_job()
    except PgjobsError:
        raise WorkflowError(
            f"workflow {name!r} runs only as a job in a pgjobs worker: enqueue it "
            f"(app.enqueue({name!r}, payload)) instead of calling it"
        ) from None
