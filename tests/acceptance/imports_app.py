"""The app of `pgjobs work --processes N` start-up tests: what each process does with it.

At import it appends ``import PID`` to the file named by $PGJOBS_TEST_IMPORTS_LOG and starts a
thread (as an error reporter's SDK does); at exit, an atexit handler appends ``exit PID``; each
``imports.record`` job appends ``run PID``. One line per write, appended: the processes share
the file.
"""

from __future__ import annotations

import atexit
import os
import threading

import pgjobs

app = pgjobs.App()  # DSN from --dsn, $PGJOBS_DATABASE_URL or the embedded server


def _say(word: str) -> None:
    with open(os.environ["PGJOBS_TEST_IMPORTS_LOG"], "a") as log:
        log.write(f"{word} {os.getpid()}\n")


@app.task(name="imports.record")
def record() -> None:
    _say("run")


_say("import")
atexit.register(_say, "exit")
threading.Thread(target=threading.Event().wait, name="sdk-like", daemon=True).start()
