"""How an ``App`` sends prepared jobs: on the caller's connection when given one, else on the
app's own pools, one-job calls that may share a statement going in together (the group commit
of ``pgjobs.enqueue.coalescing``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pgjobs.enqueue import coalescing, door
from pgjobs.enqueue.rows import PreparedJob

if TYPE_CHECKING:
    from pgjobs.pools import Pools


class Sender:
    """The enqueue side of one ``App``: its pools and its group commits (sync, and one per
    event loop).

    Example: ``Sender(pools).insert([enqueue.prepare(spec, app.tasks)], None)``
    """

    def __init__(self, pools: Pools) -> None:
        self._pools = pools
        self._coalescer = coalescing.Coalescer(self._send)
        self._async_coalescer: coalescing.AsyncCoalescer[int] | None = None

    def insert(self, rows: list[PreparedJob], connection: Any, *, many: bool = False) -> list[int]:
        """Insert ``rows`` on ``connection`` (the caller's), else on the app's pool; their ids."""
        if connection is not None:
            return door.insert(connection, rows, many=many)
        if not many and coalescing.fits(rows[0]):
            return [self._coalescer.insert(rows[0])]
        return self._pools.run(
            lambda conn, dsn: door.insert(conn, rows, dsn, pooled=True, many=many)
        )

    async def insert_async(
        self, rows: list[PreparedJob], connection: Any, *, many: bool = False
    ) -> list[int]:
        """``insert`` for asyncio applications (the app's async pool, or the caller's async
        connection)."""
        if connection is not None:
            return await door.insert_async(connection, rows, many=many)
        if not many and coalescing.fits(rows[0]):
            coalescer = self._async_coalescer
            if coalescer is None or coalescer.loop is not asyncio.get_running_loop():
                coalescer = self._async_coalescer = coalescing.AsyncCoalescer(self._send_async)
            return [await coalescer.insert(rows[0])]
        return await self._pools.run_async(
            lambda conn, dsn: door.insert_async(conn, rows, dsn, many=many)
        )

    def write_batch(
        self, callback: dict[str, Any], rows: Sequence[PreparedJob], connection: Any
    ) -> tuple[int, list[int]]:
        """Write a batch and its members; its id and theirs."""
        if connection is not None:
            return door.write_batch(connection, callback, rows)
        return self._pools.run(lambda conn, dsn: door.write_batch(conn, callback, rows, dsn))

    async def write_batch_async(
        self, callback: dict[str, Any], rows: Sequence[PreparedJob], connection: Any
    ) -> tuple[int, list[int]]:
        """``write_batch`` for asyncio applications."""
        if connection is not None:
            return await door.write_batch_async(connection, callback, rows)
        return await self._pools.run_async(
            lambda conn, dsn: door.write_batch_async(conn, callback, rows, dsn)
        )

    def _send(self, rows: list[PreparedJob]) -> list[int]:
        """A flight of one-job calls in one statement on the app's pool (one commit)."""
        # Not db.pooled: insert translates errors itself.
        return self._pools.run(lambda conn, dsn: door.insert(conn, rows, dsn, pooled=True))

    async def _send_async(self, rows: list[PreparedJob]) -> list[int]:
        """``_send`` on the running loop's pool."""
        return await self._pools.run_async(lambda conn, dsn: door.insert_async(conn, rows, dsn))
