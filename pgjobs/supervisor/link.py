"""The worker process's side of `pgjobs work --processes N`: ``SupervisorLink``, its end of the
socket pair shared with the supervisor."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading

from pgjobs.db.dsn import Dsn
from pgjobs.errors import ConfigurationError, PgjobsError
from pgjobs.supervisor.protocol import FAILED, LONGEST_LINE, READY, SLOT_ENV, read_dsn


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
            self._channel.sendall(READY)

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
        message = " ".join(str(error).splitlines())[: LONGEST_LINE // 2]
        try:
            self._channel.sendall(b"%s %d %s\n" % (FAILED, code, message.encode()))
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
                    self._dsn = read_dsn(heard.partition(b"\n")[0])
                    if self._dsn is None:
                        break
                    self._handed.set()
                elif len(heard) > LONGEST_LINE:
                    break
        if not self._handed.is_set():
            # The supervisor went away (or gave up its own start) before handing the database
            # over: nothing has started here, and the supervisor reports its own error.
            os._exit(1)
        # The supervisor's end closed: it exited without stopping this process first.
        os.kill(os.getpid(), signal.SIGTERM)
