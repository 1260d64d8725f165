"""The one door every job comes in by: ``App.enqueue`` and its forms, ``app.batch``, the HTTP
API, ``pgjobs enqueue``, the producer command, periodic schedules and the test helpers. A
submission is checked once (``prepare``: its options, its payload, its ``Shape``), then sent by
the one dispatch (``door.plan``) to the statement its shape needs.
"""

from pgjobs.enqueue.checks import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH, handler_arguments
from pgjobs.enqueue.coalescing import AsyncCoalescer, fits
from pgjobs.enqueue.door import insert, insert_async, write_batch, write_batch_async
from pgjobs.enqueue.rows import PreparedJob, Shape, prepare, prepare_many
from pgjobs.enqueue.sender import Sender
from pgjobs.enqueue.statements import COPY_MIN_ROWS, shown

__all__ = [
    "COPY_MIN_ROWS",
    "MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "AsyncCoalescer",
    "PreparedJob",
    "Sender",
    "Shape",
    "fits",
    "handler_arguments",
    "insert",
    "insert_async",
    "prepare",
    "prepare_many",
    "shown",
    "write_batch",
    "write_batch_async",
]
