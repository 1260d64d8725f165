"""`pgjobs work --processes N`: one command that runs N worker processes and looks after them.

One worker process is one asyncio loop, so it uses one CPU core at most. The command forks its N
worker processes at once, first thing, before it imports your app or resolves the database:
each is then a copy of a process that has imported pgjobs and nothing of yours, holds no
connection, no thread and no event loop (a forked connection or loop is not safe to use; a
process with a thread is not forked, its worker processes start as below). Each worker process
imports your app itself, so N start about as fast as one. The supervisor then imports the app
too, resolves the database once (the embedded server is started once for all) and hands it to
each of them. A worker process that replaces one that died starts as a fresh interpreter
running ``python -m pgjobs work ...`` with the same options, working directory and environment:
the supervisor has imported your app by then, and a fork would copy what your app started at
import (threads, connections). The supervisor never connects to the database itself; every
worker process registers in ``pgjobs_workers`` as a single worker does.

A worker process and its supervisor share a socket pair (for a fresh interpreter, the hidden
``--supervisor-fd`` option):

- the supervisor sends the database first (``dsn [url, source]``, never on a command line, where
  a password would show in `ps`); a worker process whose supervisor went away before that
  exits at once, quietly: it had started nothing, and the supervisor reports its own error;
- the worker process writes ``ready`` once its start-up checks passed (app imported, database
  reached, schema current), or ``failed CODE MESSAGE`` when they failed, instead of printing the
  error itself (N processes would print it N times). A failed start before any worker process
  was ready means that the configuration is wrong: the supervisor stops the others and raises
  that error, so the command prints it once and exits with its code (2 for a bad
  configuration, 1 for the others); a worker process that exits with 1 or 2 before it was ready
  without saying why ends it all alike. After one was ready, a failed start is logged with its
  reason and replaced like any other exit;
- the supervisor's end closes when the supervisor exits, even by kill -9: the worker process then
  stops itself as on SIGTERM, so that no worker runs on unsupervised.

Each worker process also learns its slot, 0..N-1 (a fresh interpreter from
``PGJOBS_SUPERVISOR_SLOT``; a replacement takes the slot of the process it replaces): with
`--http HOST:PORT`, worker process i listens on PORT+i.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn, Protocol

from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, PgjobsError

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
#: The environment variable that tells a worker process started as a fresh interpreter its
#: slot: 0..N-1, the same for the process that replaces it (`--http` adds it to the port).
SLOT_ENV = "PGJOBS_SUPERVISOR_SLOT"
#: Seconds a forked worker process gets to exit once the command gave up before supervising it.
ABANDON_WAIT = 10.0
_DSN = b"dsn"
_READY = b"ready\n"
_FAILED = b"failed"
#: Longest line a worker process may say (an error message is one line, far shorter).
_LONGEST_LINE = 64 * 1024
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
        self._hello = b"%s %s\n" % (_DSN, json.dumps([dsn.url, dsn.source]).encode())
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
            if len(slot.heard) > _LONGEST_LINE:  # not a worker process of ours: stop listening
                self._close(slot)

    def _said(self, slot: _Slot, line: bytes) -> None:
        if line == _READY.rstrip():
            slot.ready = True
            self._any_ready = True
            return
        word, _, rest = line.partition(b" ")
        code, _, message = rest.partition(b" ")
        if word == _FAILED and code.isdigit():
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


class SupervisorLink:
    """A worker process's end of the socket pair it shares with the supervisor that started it:
    the database the supervisor hands over, a way to say "ready", and a watch that stops this
    process, as SIGTERM does, once the supervisor is gone.

    ``slot`` is given to a forked worker process; a fresh interpreter (``--supervisor-fd``)
    reads it from the environment.

    Example (what `pgjobs work --supervisor-fd N` does)::

        link = SupervisorLink(fd)
        app.bind(link.dsn)
        Worker(app, config).run(on_checked=link.ready)
    """

    def __init__(self, fd: int, *, slot: int | None = None) -> None:
        given = os.environ.pop(SLOT_ENV, None)  # not passed on to processes that handlers start
        try:
            #: This worker process's slot, 0..N-1.
            self.slot = slot if slot is not None else int(given or "")
            channel = socket.socket(fileno=fd)
        except (OSError, ValueError):
            raise ConfigurationError(
                "--supervisor-fd is only for the worker processes that "
                "`pgjobs work --processes N` starts"
            ) from None
        channel.set_inheritable(False)  # processes that handlers start must not hold it open
        #: Forked by the supervisor (else a fresh interpreter).
        self.forked = slot is not None
        self._channel = channel
        self._ready = False
        self._dsn: Dsn | None = None
        self._handed = threading.Event()
        threading.Thread(target=self._listen, name="pgjobs-supervisor-link", daemon=True).start()

    @property
    def dsn(self) -> Dsn:
        """The database the supervisor resolved; waits until it has been handed over.

        Example: ``app.bind(link.dsn)``
        """
        self._handed.wait()
        assert self._dsn is not None  # else _listen ended the process
        return self._dsn

    def ready(self) -> None:
        """Tell the supervisor that this worker process passed its start-up checks.

        Example: ``Worker(app, config).run(on_checked=link.ready)``
        """
        self._ready = True
        with contextlib.suppress(OSError):  # the supervisor is gone: the watch stops us
            self._channel.sendall(_READY)

    def failed(self, error: PgjobsError, code: int) -> bool:
        """Tell the supervisor that this worker process could not start, with ``error`` (one
        line) and the exit code it leaves with, rather than print it: the supervisor prints the
        error of N failed starts once. False when it cannot be told (it is gone after handing
        the database over, or this process said ``ready`` already): the caller reports the
        error itself. A supervisor gone before it handed the database over reports its own.

        Example: ``if not link.failed(exc, 2): raise exc``
        """
        if self._ready:
            return False
        message = " ".join(str(error).splitlines())[: _LONGEST_LINE // 2]
        try:
            self._channel.sendall(b"%s %d %s\n" % (_FAILED, code, message.encode()))
        except OSError:
            return not self._handed.is_set()
        return True

    def _listen(self) -> None:
        heard = b""
        with contextlib.suppress(OSError):
            while said := self._channel.recv(4096):
                if self._handed.is_set():
                    continue  # the supervisor says nothing more; wait for its end to close
                heard += said
                if b"\n" in heard:
                    self._dsn = _read_dsn(heard.partition(b"\n")[0])
                    if self._dsn is None:
                        break
                    self._handed.set()
                elif len(heard) > _LONGEST_LINE:
                    break
        if not self._handed.is_set():
            # The supervisor went away (or gave up its own start) before handing the database
            # over: nothing has started here, and the supervisor reports its own error.
            os._exit(1)
        # The supervisor's end closed: it exited without stopping this process first.
        os.kill(os.getpid(), signal.SIGTERM)


def _read_dsn(line: bytes) -> Dsn | None:
    """The database in the supervisor's first line, ``dsn [url, source]``; None for another
    line."""
    word, _, rest = line.partition(b" ")
    try:
        url, source = json.loads(rest) if word == _DSN else (None, None)
    except (TypeError, ValueError):
        return None
    if not isinstance(url, str) or not isinstance(source, str):
        return None
    return Dsn(url, source)
