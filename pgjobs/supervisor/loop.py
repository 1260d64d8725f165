"""``Supervisor``: the loop that starts N worker processes, hands each the database, forwards
signals, and replaces a process that died after a delay (``restart_delay``)."""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.supervisor.forking import Forked
from pgjobs.supervisor.protocol import FAILED, LONGEST_LINE, READY, SLOT_ENV, hello

log = logging.getLogger("pgjobs.supervisor")

#: The most worker processes ``--processes`` starts: each keeps about five connections, so far
#: more would exhaust any server's max_connections (and a typo would fork thousands).
MAX_PROCESSES = 256
#: Seconds before a worker process that died is replaced; doubled after each quick death.
FIRST_RESTART_DELAY = 1.0
#: Longest wait before a replacement, in seconds.
MAX_RESTART_DELAY = 30.0
#: Seconds a worker process must have run for its replacement to wait FIRST_RESTART_DELAY again.
STABLE_AFTER = 60.0
#: Exit codes of `pgjobs` errors: 2 for a bad configuration or usage, 1 for the others.
START_ERROR_CODES = frozenset({1, 2})
_FORWARDED = (signal.SIGTERM, signal.SIGINT)


def restart_delay(previous: float | None, ran_for: float) -> float:
    """Seconds to wait before replacing a worker process that died after ``ran_for`` seconds,
    given the wait before it was started (None for the first process of its slot): 1 s, doubled
    after each death within ``STABLE_AFTER`` seconds of a start, at most 30 s.

    Example: ``restart_delay(4.0, ran_for=2.5) == 8.0`` and ``restart_delay(30.0, ran_for=600)
    == 1.0``
    """
    if previous is None or ran_for >= STABLE_AFTER:
        return FIRST_RESTART_DELAY
    return min(previous * 2, MAX_RESTART_DELAY)


def exit_code(returncode: int) -> int:
    """A process's ``returncode`` as a shell reports it: 128 + N when signal N killed it.

    Example: ``exit_code(-9) == 137`` and ``exit_code(0) == 0``
    """
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


class _Process(Protocol):
    """What the supervisor needs of a worker process: ``subprocess.Popen`` or `ForkedProcess`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


@dataclass(eq=False)
class _Slot:
    """One of the N worker processes, across its replacements."""

    proc: _Process | None = None
    #: The supervisor's end of the socket pair shared with ``proc``.
    channel: socket.socket | None = None
    #: time.monotonic() when ``proc`` started.
    started_at: float = 0.0
    #: ``proc`` said it passed its start-up checks.
    ready: bool = False
    #: time.monotonic() at which to start the next process; None: no start is due.
    start_at: float | None = None
    #: Seconds waited before starting ``proc``; None for the slot's first process.
    delay: float | None = None
    #: What ``proc`` said and the supervisor has not read as a whole line yet.
    heard: bytes = b""
    #: (exit code, message) of the error with which ``proc`` said its start failed.
    failure: tuple[int, str] | None = None


class Supervisor:
    """Runs ``processes`` worker processes of one `pgjobs work` command until they are all done.

    ``forked`` are the worker processes `fork_workers` made (slots 0.., as many as it could);
    ``command`` starts the others, and every replacement, as a fresh interpreter (the
    supervisor adds ``--supervisor-fd``). ``dsn`` is handed to every one of them. They start at
    once. SIGTERM and SIGINT are forwarded (a second one too); a worker process that dies is
    replaced after a delay (see ``restart_delay``), except with ``burst``, where each one runs
    until it finds the queues empty.

    Example::

        command = [sys.executable, "-m", "pgjobs", "work", "--app=myapp.jobs:app"]
        sys.exit(Supervisor(command, resolve_dsn(None), processes=4).run())
    """

    def __init__(
        self,
        command: Sequence[str],
        dsn: Dsn,
        processes: int,
        *,
        burst: bool = False,
        forked: Sequence[Forked] = (),
    ) -> None:
        if processes < 1:
            raise ConfigurationError(f"processes must be >= 1, got {processes}")
        if len(forked) > processes:
            raise ConfigurationError(f"{len(forked)} forked worker processes for {processes}")
        self.command = list(command)
        self.dsn = dsn
        self.burst = burst
        self._slots = [_Slot() for _ in range(processes)]
        now = time.monotonic()
        for slot, each in zip(self._slots, forked, strict=False):
            slot.proc, slot.channel, slot.started_at = each.process, each.channel, now
        self._hello = hello(dsn)
        self._received: list[int] = []  # signals caught and not forwarded yet
        self._stopping = False
        self._any_ready = False  # some worker process passed its start-up checks
        self._failed: int | None = None  # the exit code of a failed start, which ends it all
        self._failure: str | None = None  # and the error it reported, if it did
        self._exits: list[int] = []  # exit codes of the processes not replaced, in exit order
        self._selector = selectors.DefaultSelector()

    def run(self) -> int:
        """Start the worker processes and look after them until they have all exited; returns 0
        when every one exited 0, else the first other exit code (a failed start's, if any).
        Raises the error a worker process reported when it failed to start before any was
        ready (``ConfigurationError`` for exit code 2, else ``PgjobsError``), once they have
        all exited.

        Example: ``sys.exit(Supervisor(command, dsn, processes=2, burst=True).run())``
        """
        wake, wake_write = socket.socketpair()
        wake.setblocking(False)
        wake_write.setblocking(False)
        self._selector.register(wake, selectors.EVENT_READ, None)
        caught = (*_FORWARDED, signal.SIGCHLD)
        handlers = {signum: signal.signal(signum, self._on_signal) for signum in caught}
        # Every signal caught writes a byte to wake_write, so the loop wakes up at once for a
        # signal to forward and for a worker process that exited (SIGCHLD): no polling.
        previous_wakeup = signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
        try:
            # All at once: a wrong configuration fails each of them, but they report their
            # error here instead of printing it, and the first one reported is raised once.
            now = time.monotonic()
            for slot in self._slots:
                if slot.channel is not None:  # forked: it waits for the database
                    self._selector.register(slot.channel, selectors.EVENT_READ, slot)
                    self._greet(slot)
                else:
                    slot.start_at = now
            while True:
                self._forward_signals()  # may cancel the starts that were due
                if self._done():
                    break
                self._start_due()
                self._wait(wake)
                self._reap()
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            # Worker processes still running here (after an error in this loop) see their channel
            # close, and stop as on SIGTERM.
            for slot in self._slots:
                self._close(slot)
            self._selector.close()
            wake.close()
            wake_write.close()
        if self._failed is not None:
            if self._failure is not None:
                error = ConfigurationError if self._failed == 2 else PgjobsError
                raise error(self._failure)
            return self._failed
        return next((code for code in self._exits if code != 0), 0)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # SIGCHLD is caught only for the wake-up byte; _reap finds who exited.
        if signum != signal.SIGCHLD:
            self._received.append(signum)

    def _done(self) -> bool:
        return all(slot.proc is None and slot.start_at is None for slot in self._slots)

    def _forward_signals(self) -> None:
        while self._received:
            signum = self._received.pop(0)
            live = self._stop(signum)
            log.info("%s: forwarded to %d worker process(es)", signal.Signals(signum).name, live)

    def _stop(self, signum: int) -> int:
        """Start nothing more and send ``signum`` to every worker process; returns how many."""
        self._stopping = True
        live = 0
        for slot in self._slots:
            slot.start_at = None
            if slot.proc is not None:
                slot.proc.send_signal(signum)
                live += 1
        return live

    def _start_due(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.proc is None and slot.start_at is not None and slot.start_at <= now:
                self._start(slot, now)

    def _start(self, slot: _Slot, now: float) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, SLOT_ENV: str(self._slots.index(slot))}
        try:
            slot.proc = subprocess.Popen(
                [*self.command, f"--supervisor-fd={theirs.fileno()}"],
                stdin=subprocess.DEVNULL,
                env=env,
                pass_fds=(theirs.fileno(),),
                # A process group of its own: Ctrl-C in a terminal then reaches the supervisor
                # only, which forwards it once (a worker takes a second signal as "exit now").
                process_group=0,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        slot.channel = ours
        slot.started_at, slot.start_at, slot.ready = now, None, False
        slot.heard, slot.failure = b"", None
        self._selector.register(ours, selectors.EVENT_READ, slot)
        self._greet(slot)

    def _greet(self, slot: _Slot) -> None:
        """Hand the database to ``slot``'s process (a few hundred bytes: the socket's buffer
        takes them without blocking)."""
        if slot.channel is not None:
            with contextlib.suppress(OSError):  # exited already: _reap finds out
                slot.channel.sendall(self._hello)

    def _wait(self, wake: socket.socket) -> None:
        """Sleep until a signal, a word from a worker process, or the next start that is due."""
        due = [slot.start_at for slot in self._slots if slot.start_at is not None]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):  # read every wake-up byte
                    while wake.recv(512):
                        pass
            else:
                self._hear(key.data)

    def _hear(self, slot: _Slot) -> None:
        """Read what ``slot``'s process said: ``ready``, or ``failed CODE MESSAGE``; its end
        closing means that it is exiting (_reap collects it)."""
        while slot.channel is not None:
            try:
                said = slot.channel.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                said = b""
            if not said:
                self._close(slot)
                return
            slot.heard += said
            while b"\n" in slot.heard:
                line, _, slot.heard = slot.heard.partition(b"\n")
                self._said(slot, line)
            if len(slot.heard) > LONGEST_LINE:  # not a worker process of ours: stop listening
                self._close(slot)

    def _said(self, slot: _Slot, line: bytes) -> None:
        if line == READY.rstrip():
            slot.ready = True
            self._any_ready = True
            return
        word, _, rest = line.partition(b" ")
        code, _, message = rest.partition(b" ")
        if word == FAILED and code.isdigit():
            slot.failure = (int(code), message.decode(errors="replace"))

    def _close(self, slot: _Slot) -> None:
        if slot.channel is not None:
            self._selector.unregister(slot.channel)
            slot.channel.close()
            slot.channel = None

    def _reap(self) -> None:
        for slot in self._slots:
            if slot.proc is not None and (returncode := slot.proc.poll()) is not None:
                self._exited(slot, slot.proc, returncode)

    def _exited(self, slot: _Slot, proc: _Process, returncode: int) -> None:
        now = time.monotonic()
        slot.proc = None
        self._hear(slot)  # what it said just before it exited
        self._close(slot)
        failure, slot.failure = slot.failure, None
        if self._stopping:
            self._exits.append(exit_code(returncode))
            return
        if (failure is not None or returncode in START_ERROR_CODES) and not self._any_ready:
            # A failed start (bad app, missing schema, unreachable database) before any worker
            # process got past its checks: a replacement would fail alike, and so do the
            # others, which are stopped. Its error is raised once they have all exited.
            self._failed, self._failure = returncode, failure[1] if failure else None
            self._stop(signal.SIGTERM)
            return
        if failure is not None:
            log.warning("worker process %d could not start: %s", proc.pid, failure[1])
        if self.burst:
            # In a burst each worker process runs once; a crash shows in the exit code.
            self._exits.append(exit_code(returncode))
            if returncode != 0:
                log.warning("worker process %d %s", proc.pid, _describe(returncode))
            return
        slot.delay = restart_delay(slot.delay, now - slot.started_at)
        slot.start_at = now + slot.delay
        log.warning(
            "worker process %d %s; starting another in %gs",
            proc.pid,
            _describe(returncode),
            slot.delay,
        )
