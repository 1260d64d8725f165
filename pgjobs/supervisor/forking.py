"""Forking the worker processes of `pgjobs work --processes N` first thing, and ending the
supervisor or a forked process without tearing its modules down."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from pgjobs.supervisor.link import SupervisorLink

#: Seconds a forked worker process gets to exit once the command gave up before supervising it.
ABANDON_WAIT = 10.0


class ForkedProcess:
    """A child process made by ``os.fork()``, seen as ``subprocess.Popen`` shows one: ``poll()``
    reaps it and sets ``returncode`` (-N when signal N killed it).

    Example: ``ForkedProcess(pid).poll() is None`` while it runs
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (SIGCHLD ignored): as Popen reads it
                self.returncode = 0
                return 0
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Poll until it exits or ``timeout`` seconds passed; its ``returncode``, or None."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


@dataclass(eq=False)
class Forked:
    """A worker process that `fork_workers` made, and the supervisor's end of its socket pair."""

    process: ForkedProcess
    channel: socket.socket


def fork_workers(processes: int) -> tuple[SupervisorLink | None, list[Forked]]:
    """Fork ``processes`` worker processes of `pgjobs work --processes N`, at once.

    In the command (the supervisor to be), returns ``(None, the N processes)``; in worker process
    i, returns ``(its SupervisorLink, [])``: it goes on as a single `pgjobs work` does, with
    that link, and waits for the database from the supervisor (``link.dsn``). Call it before
    anything of the application is imported or connected. A process running a second thread
    is not forked (the copy would hold that thread's locks, without the thread): the result
    is then ``(None, [])`` and the supervisor starts fresh interpreters instead (as it does for
    the slots past a fork that failed).

    Example::

        link, forked = fork_workers(4)
        if link is None:
            Supervisor(command, app.dsn, 4, forked=forked).run()
    """
    if threading.active_count() > 1:
        return None, []
    for stream in (sys.stdout, sys.stderr):  # what a copy holds in its buffer would show twice
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    forked: list[Forked] = []
    for slot in range(processes):
        ours, theirs = socket.socketpair()
        try:
            pid = os.fork()
        except OSError:  # out of processes or memory: the supervisor starts the rest, or says why
            ours.close()
            theirs.close()
            break
        if pid == 0:
            return _forked_child(slot, theirs, [ours, *(each.channel for each in forked)]), []
        theirs.close()
        with contextlib.suppress(OSError):  # the child may have done it, or exited, already
            os.setpgid(pid, pid)
        ours.setblocking(False)
        forked.append(Forked(ForkedProcess(pid), ours))
    return None, forked


def _forked_child(slot: int, channel: socket.socket, others: list[socket.socket]) -> SupervisorLink:
    """In worker process ``slot`` just forked: what `subprocess.Popen` would have set up."""
    for other in others:  # the supervisor's ends: the supervisor's exit must close them
        other.close()
    # A process group of its own: Ctrl-C in a terminal then reaches the supervisor only, which
    # forwards it once (a worker takes a second signal as "exit now").
    os.setpgid(0, 0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return SupervisorLink(channel.detach(), slot=slot)


def leave(code: int) -> NoReturn:
    """End the supervisor of `pgjobs work --processes N`, or a worker process it forked, with
    exit code ``code``: the atexit handlers run (the application's own among them), standard
    output and error are flushed, and the process exits without tearing down its modules. A
    forked worker process shares its memory with the supervisor until it writes to it, and a
    teardown writes to all of it (copy on write): it took ~30 ms of a burst's end, measured,
    and the supervisor's own ~20 ms (multiprocessing ends its processes alike, without even the
    atexit handlers).

    Example: ``leave(0)``
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def abandon(forked: Sequence[Forked]) -> None:
    """Close the channels of worker processes forked for a command that failed before it could
    supervise them (no database handed over yet: they exit at once, quietly) and reap them;
    one still running after ``ABANDON_WAIT`` seconds is killed."""
    for each in forked:
        each.channel.close()
    deadline = time.monotonic() + ABANDON_WAIT
    for each in forked:
        if each.process.wait(max(0.0, deadline - time.monotonic())) is None:
            each.process.send_signal(signal.SIGKILL)
            each.process.wait(ABANDON_WAIT)
