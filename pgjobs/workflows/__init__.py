"""Durable workflows (``@app.workflow``): handlers made of steps whose results are recorded in
PostgreSQL, so that a run after a crash, a retry or a redrive returns the recorded ones without
running them again; sleeps that give the worker slot back. Layout, bottom up: ``policy`` (how a
step is tried again), ``history`` (the recorded entries and their records, fenced by the run's
lease), ``context`` (``WorkflowContext``), ``handler`` (the user's function wrapped as a task's
handler). Why the history is built this way: docs/decisions/0026-durable-workflows.md."""

from __future__ import annotations

from pgjobs.workflows.context import WorkflowContext
from pgjobs.workflows.handler import workflow_handler
from pgjobs.workflows.history import WorkflowLeaseLost
from pgjobs.workflows.policy import StepPolicy, step_policy

__all__ = ["StepPolicy", "WorkflowContext", "WorkflowLeaseLost", "step_policy", "workflow_handler"]
