"""What an App declares: its tasks, external tasks and periodic schedules, and the jobs they
make, checked against those declarations before anything reaches the database."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Unpack, overload

from pgjobs import enqueue
from pgjobs.errors import ConfigurationError
from pgjobs.periodic import DEFAULT_CATCH_UP, DEFAULT_TIMEZONE, Periodic, ScheduleOptions
from pgjobs.pools import Pools
from pgjobs.submission import JobOptions, JobSpec, check_name
from pgjobs.targets import ExternalTarget, check_headers
from pgjobs.tasks import HandlerOptions, Task, TaskOptions, make_task, refuse_unknown
from pgjobs.workflows import workflow_handler


class Registry:
    """The declarations half of ``pgjobs.App``: ``task``, ``external_task`` and ``periodic``,
    and the registered tasks that enqueue checks names and payloads against (with
    ``check_task_names``, the default, once at least one task is registered)."""

    def __init__(self, *, check_task_names: bool = True) -> None:
        self._tasks: dict[str, Task] = {}
        self._periodics: dict[str, Periodic] = {}
        self._check_task_names = check_task_names

    @property
    def _known_tasks(self) -> Mapping[str, Task] | None:
        """The tasks enqueue checks against; None when the app checks no task names."""
        return self._tasks if self._check_task_names else None

    @property
    def tasks(self) -> Mapping[str, Task]:
        """The registered tasks by name (read-only)."""
        return MappingProxyType(self._tasks)

    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(
        self, fn: None = None, /, **options: Unpack[HandlerOptions]
    ) -> Callable[[Callable[..., Any]], Task]: ...

    def task(
        self, fn: Callable[..., Any] | None = None, /, **options: Unpack[HandlerOptions]
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a handler; it receives the job's JSON payload keys as keyword arguments.

        ``name`` defaults to ``module.function``; set it explicitly so that renaming or moving the
        function does not orphan queued jobs. ``retry_base``/``retry_cap`` (seconds) shape the
        backoff between attempts; ``retry_on`` (the only exception classes that retry),
        ``never_retry_on`` (classes sent to ``dead_letter`` at once) and ``retry_delays`` (class
        -> seconds a retry waits instead of the backoff) say which errors are worth a retry;
        ``lease`` (seconds) is how long one run may take before the job
        counts as lost and is run again: set it above the handler's longest expected run, or
        call ``pgjobs.current_job().extend_lease(seconds)`` from a long handler. An
        ``at_most_once`` task is never run twice: when its lease expires (the worker died or
        hung), the job goes to ``dead_letter`` instead of running again.

        ``timeout`` (seconds, shorter than ``lease``) bounds one run: past it the worker stops
        the handler (an async one is cancelled; a sync one, which Python cannot stop, is
        abandoned in its thread and sees ``pgjobs.current_job().cancelled`` become True) and the
        attempt fails with reason timeout: retried with backoff while attempts remain, else sent
        to ``dead_letter`` with reason ``timeout`` (an at-most-once task's at once).

        Annotated parameters (``int``, ``float``, ``str``, ``bool``, ``None``, unions,
        ``list[X]``, ``dict[str, X]``, ``Literal``) are checked at enqueue (``InvalidPayload``
        naming ``payload.<name>``) and again when a worker starts the job (``dead_letter``,
        ``invalid_payload``); a handler taking one pydantic model or dataclass receives it built
        from the payload. ``version`` is the version of the payloads the handler takes, stored
        with each job; ``upgrade`` maps each older version to a function returning the payload
        of the next version, which a worker applies, in order, to the jobs enqueued before.

        ``concurrency`` caps the jobs of this task running at once across every worker and
        host; ``rate`` ("100/s", "10/m", "5/10s") caps how many start per period (a token
        bucket holding one period's jobs). Both are enforced by the claim itself: jobs held
        back stay ready, and other tasks of the queue are claimed past them. Declare them the
        same in every worker that runs the task (a worker enforces what its code declares).

        ``group_concurrency`` caps the running jobs of this task that share a group
        (``enqueue(..., group="customer-42")``), whatever queues they are in; ``ordered=True``
        runs one job of a group at a time, in enqueue order across its queues, even across
        retries (``"hold"``: a dead job keeps holding its group); ``group_rate`` ("10/m") caps
        the starts of this task's jobs of one group per period, in any window of the period.
        ``debounce`` is the delay of
        ``on_conflict="debounce"``; ``throttle`` lets at most one job per unique key start per so
        many seconds. See the "Fairness and uniqueness" guide.

        The options and their defaults are those of ``pgjobs.tasks.HandlerOptions``.

        Example: ``@app.task(name="billing.charge", queue="billing", max_attempts=10)``

        Example: ``@app.task(name="crm.sync", concurrency=5, rate="100/m")``

        Example: ``@app.task(name="reports.build", timeout=30, lease=120)``

        Example::

            def to_cents(payload: dict[str, Any]) -> dict[str, Any]:
                return {"cents": round(payload["amount"] * 100)}

            @app.task(name="billing.charge", version=2, upgrade={1: to_cents})
            def charge(cents: int) -> None: ...
        """
        refuse_unknown(options, HandlerOptions, "App.task")

        def register(fn: Callable[..., Any]) -> Task:
            return self._register(make_task(fn, **options))

        return register(fn) if fn is not None else register

    @overload
    def workflow(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def workflow(
        self, fn: None = None, /, **options: Unpack[HandlerOptions]
    ) -> Callable[[Callable[..., Any]], Task]: ...

    def workflow(
        self, fn: Callable[..., Any] | None = None, /, **options: Unpack[HandlerOptions]
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a durable workflow: a task whose handler takes a ``pgjobs.WorkflowContext``
        first, then the payload's keys as a task's does, and is made of steps
        (``ctx.step(name, fn, *args, **kwargs)``) whose results are recorded in PostgreSQL. When
        the job runs again (a retry, a lease expiry after a crash, ``pgjobs dead redrive``),
        each recorded step returns its result without running; the first unrecorded one runs.
        ``ctx.transaction()`` inside a step commits the step's own writes with its record
        (exactly once); ``ctx.sleep(seconds)`` / ``ctx.sleep_until(when)`` give the slot back
        until then, spending no attempt. An async function makes an async workflow (its
        ``ctx`` methods are awaited). The handler's return value is the job's result.

        The options are those of ``task``; ``retry_base``, ``retry_cap``, ``retry_on``,
        ``never_retry_on`` and ``retry_delays`` also shape the retries of its steps (3
        attempts each, unless ``pgjobs.step_policy`` says otherwise). See the "Durable
        workflows" guide.

        Example::

            @app.workflow(name="shop.checkout", queue="orders")
            def checkout(ctx: pgjobs.WorkflowContext, order_id: int) -> dict[str, Any]:
                charge = ctx.step("charge", charge_card, order_id)
                ctx.step("email", send_receipt, order_id)
                return {"charge": charge}
        """
        refuse_unknown(options, HandlerOptions, "App.workflow")

        def register(fn: Callable[..., Any]) -> Task:
            made: list[Task] = []
            handler = workflow_handler(
                fn, self._workflow_pools, lambda: made[0], self._workflow_app
            )
            task = make_task(handler, **options)
            made.append(task)
            return self._register(task)

        return register(fn) if fn is not None else register

    def _workflow_pools(self) -> Pools:
        """The pools a workflow's steps record on: the App's."""
        raise ConfigurationError("workflows need an App: declare them with App.workflow")

    def _workflow_app(self) -> Any:
        """The App a workflow enqueues its children through."""
        raise ConfigurationError("workflows need an App: declare them with App.workflow")

    def external_task(
        self,
        name: str,
        *,
        url: str | None = None,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **options: Unpack[TaskOptions],
    ) -> Task:
        """Register a task whose jobs are not run by a Python handler: a worker delivers each
        job to a downstream HTTP service (a JSON ``POST`` to ``url``), which reports the outcome
        later with ``POST /api/v1/jobs/{id}/outcome`` (``pgjobs serve``) or
        ``App.report_outcome``.

        A 2xx answer to the delivery leaves the job running: ``lease`` (seconds) is the
        downstream's deadline to report, delivery included; without a report by then the lease
        rules apply (delivered again on a later attempt, or ``dead_letter`` for an
        ``at_most_once`` task or on the last attempt). Any other answer, a timeout or an
        unreachable host is a failed attempt, retried with backoff. ``timeout`` (seconds) bounds
        one delivery and must be shorter than ``lease``; ``headers`` are sent with every
        delivery (their values are never logged). ``url``, ``timeout`` and headers left out come
        from the worker (`pgjobs work --external-url ... --external-timeout ...
        --external-header ...`, or ``$PGJOBS_EXTERNAL_TOKEN`` for a bearer token).
        ``concurrency`` caps the jobs the downstream holds at once (delivered and not yet
        reported), ``rate`` the deliveries per period, as for ``task``; the other options
        and their defaults are those of ``pgjobs.tasks.TaskOptions``.

        Example::

            charge = app.external_task(
                "billing.charge",
                url="https://billing.internal/jobs",
                headers={"Authorization": "Bearer " + os.environ["BILLING_TOKEN"]},
                lease=600,
            )
            app.enqueue(charge, {"order": 42})
        """
        refuse_unknown(options, TaskOptions, "App.external_task")
        name = check_name("task", name)

        def not_callable(**payload: Any) -> Any:
            raise ConfigurationError(
                f"task {name!r} is external: a worker delivers its jobs over HTTP; "
                f"enqueue it (app.enqueue({name!r}, payload)) instead of calling it"
            )

        not_callable.__qualname__ = not_callable.__name__ = name
        target = ExternalTarget(url, timeout, check_headers("headers", headers))
        task = make_task(not_callable, external=target, name=name, **options)
        return self._register(task)

    @property
    def periodics(self) -> Mapping[str, Periodic]:
        """The periodic schedules declared with ``periodic``, by name (read-only)."""
        return MappingProxyType(self._periodics)

    @overload
    def periodic(
        self, cron: str | None = None, /, *, task: str | Task, **options: Unpack[ScheduleOptions]
    ) -> Periodic: ...

    @overload
    def periodic(
        self, cron: str | None = None, /, *, task: None = None, **options: Unpack[ScheduleOptions]
    ) -> Callable[[Task | Callable[..., Any]], Task]: ...

    def periodic(
        self,
        cron: str | None = None,
        /,
        *,
        task: str | Task | None = None,
        **options: Unpack[ScheduleOptions],
    ) -> Periodic | Callable[[Task | Callable[..., Any]], Task]:
        """Enqueue a task on a schedule: a cron expression (5 fields, or 6 with seconds first)
        read in ``timezone``, or ``every`` (a ``timedelta`` of whole seconds, counted from the
        Unix epoch). Stacked on ``@app.task`` it schedules that task and returns it; with
        ``task=`` it schedules a task by name and returns the ``Periodic``.

        Workers that run maintenance enqueue each occurrence once, however many run, with
        ``run_at`` the scheduled instant. ``catch_up`` says what to do with occurrences missed
        while no worker ran: ``"last"`` (default) runs the latest one, ``"skip"`` none, ``N`` the
        latest N. ``name`` (default: the task's name) identifies the schedule in the database:
        keep it when changing the expression. See ``pgjobs.periodic`` for DST. The options and
        their defaults are those of ``pgjobs.periodic.ScheduleOptions``.

        Example::

            @app.periodic("0 7 * * mon-fri", name="reports.daily", timezone="Europe/Berlin")
            @app.task(queue="reports")
            def daily_report() -> None: ...

            app.periodic(every=timedelta(minutes=5), task="cache.refresh", payload={"all": True})
        """
        refuse_unknown(options, ScheduleOptions, "App.periodic")

        def declare(target: str | Task) -> Periodic:
            task_name = target.name if isinstance(target, Task) else target
            payload, name = options.get("payload"), options.get("name")
            # The task's defaults (queue, attempts) and the payload checked as enqueue checks them.
            job: JobOptions = {
                "queue": options.get("queue"),
                "priority": options.get("priority", 0),
                "max_attempts": options.get("max_attempts"),
            }
            prepared = self._prepare_one(task_name, payload, job, "periodic")
            schedule = Periodic(
                name if name is not None else task_name,
                task_name,
                payload or {},
                cron=cron,
                every=options.get("every"),
                timezone=options.get("timezone", DEFAULT_TIMEZONE),
                catch_up=options.get("catch_up", DEFAULT_CATCH_UP),
                queue=prepared.queue,
                priority=prepared.priority,
                max_attempts=prepared.max_attempts,
            )
            if schedule.name in self._periodics:
                raise ConfigurationError(
                    f"a schedule named {schedule.name!r} is already declared; give each "
                    "schedule of a task its own name=",
                    field="name",
                )
            self._periodics[schedule.name] = schedule
            return schedule

        if task is not None:
            return declare(task)

        def decorate(target: Task | Callable[..., Any]) -> Task:
            if not isinstance(target, Task):
                target = self.task(target)
            declare(target)
            return target

        return decorate

    def _register(self, task: Task) -> Task:
        if task.name in self._tasks:
            raise ConfigurationError(
                f"a task named {task.name!r} is already registered", field="task"
            )
        self._tasks[task.name] = task
        return task

    def prepare(self, spec: JobSpec, *, complete: bool = False) -> enqueue.PreparedJob:
        """``spec`` checked as ``enqueue`` checks a job against this app's tasks (their names,
        payloads and defaults), ready to insert; a ``PgjobsError`` naming the problem when it is
        not valid (``UnknownTask``, ``InvalidPayload``, ``ConfigurationError``). ``complete``:
        the payload is also checked to call its registered handler, as the CLI and ``eager()``
        check it (``enqueue.handler_arguments``). The HTTP API enqueues what it returns.

        Example: ``app.prepare(JobSpec("send_welcome", {"user_id": 42})).queue``
        """
        return enqueue.prepare(spec, self._known_tasks, complete=complete)

    def prepare_many(
        self, specs: Iterable[JobSpec], *, complete: bool = False
    ) -> list[enqueue.PreparedJob]:
        """``prepare`` every spec as ``enqueue_many`` does: the first invalid one raises, named
        by its position (``jobs[3].priority``).

        Example: ``app.prepare_many(JobSpec("resize", {"image": n}) for n in range(3))``
        """
        return enqueue.prepare_many(specs, self._known_tasks, complete=complete)

    def _prepare_one(
        self, task: str | Task, payload: dict[str, Any] | None, options: JobOptions, caller: str
    ) -> enqueue.PreparedJob:
        """The job ``enqueue`` and ``enqueue_async`` (the ``caller``) write: their arguments as
        a ``JobSpec``, prepared."""
        try:
            spec = JobSpec(task.name if isinstance(task, Task) else task, payload, **options)
        except TypeError:  # an unknown option: named as Python names an unknown argument
            refuse_unknown(options, JobOptions, f"App.{caller}")
            raise
        return enqueue.prepare(spec, self._known_tasks)
