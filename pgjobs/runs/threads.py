"""The threads that run sync handlers, a worker's and ``drain``'s alike.

``ThreadPoolExecutor`` pays for its generality on every call: a ``Future`` with its own
condition variable, set running and then done under it, and an idle semaphore taken and given
back, about five Python-level lock round trips per job. A worker needs less of a call: to run
it on a free thread, to cancel it before it starts, and to know whether it ended (outcomes go
back to the event loop another way). ``HandlerThreads`` does that with one C-level lock and
``queue.SimpleQueue``; threads start on demand up to a bound, as the executor's do.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

#: A call's states: waiting for a thread, started, returned (or raised), cancelled unstarted.
WAITING, STARTED, ENDED, CANCELLED = range(4)

#: The worker's logger, as before these threads served drain too: log filters keep working.
log = logging.getLogger("pgjobs.worker.threads")


class Run:
    """A call handed to ``HandlerThreads.submit``."""

    __slots__ = ("_args", "_fn", "_lock", "state")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], lock: threading.Lock):
        self._fn = fn
        self._args = args
        self._lock = lock
        self.state = WAITING

    def cancel(self) -> bool:
        """Keep the call from starting; False when a thread has started it already."""
        with self._lock:
            if self.state == WAITING:
                self.state = CANCELLED
            return self.state == CANCELLED

    def done(self) -> bool:
        """Whether the call returned, raised or was cancelled before it started."""
        return self.state >= ENDED

    def _start(self) -> bool:
        with self._lock:
            if self.state != WAITING:
                return False
            self.state = STARTED
            return True

    def _run(self) -> None:
        """Call it, unless it was cancelled."""
        if not self._start():
            return
        try:
            self._fn(*self._args)
        finally:
            self.state = ENDED
            self._fn = self._args = None  # type: ignore[assignment]  # nothing held once ended


class HandlerThreads:
    """Up to ``size`` threads named ``name``-N, started as calls need them, each taking calls
    one at a time from one queue.

    Example: ``threads = HandlerThreads(64, "pgjobs-handler"); run = threads.submit(print, 1)``
    """

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one thread, got {size}")
        self.size = size
        self.name = name
        self._calls: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: Threads waiting for a call that no submitted call has counted on yet.
        self._spare = 0
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Run:
        """Run ``fn(*args)`` on a free thread (a new one if none is free and the bound allows;
        else once a thread frees up)."""
        run = Run(fn, args, self._lock)
        with self._lock:
            if self._closed:
                raise RuntimeError("the handler threads are shut down")
            if self._spare:
                self._spare -= 1
                start = False
            else:
                start = len(self._threads) < self.size
            if start:
                thread = threading.Thread(
                    target=self._serve, name=f"{self.name}-{len(self._threads)}"
                )
                self._threads.append(thread)
        self._calls.put(run)
        if start:
            thread.start()
        return run

    def shutdown(self, *, wait: bool) -> None:
        """Cancel the calls no thread started, let each thread end after its current call, and
        with ``wait`` join them (a handler that never returns keeps its thread: without
        ``wait`` it runs on, unheeded)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while True:
            try:
                run = self._calls.get_nowait()
            except queue.Empty:
                break
            if run is not None:
                run.cancel()
        for _ in threads:
            self._calls.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _serve(self) -> None:
        calls = self._calls
        while True:
            run = calls.get()
            if run is None:
                return
            try:
                run._run()
            except BaseException:  # a worker's calls catch everything; the thread carries on
                log.exception("a call on thread %s raised", threading.current_thread().name)
            del run
            with self._lock:
                self._spare += 1
