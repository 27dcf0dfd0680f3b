"""Several async event streams as one: ``(stream index, item)`` pairs in the order items arrive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any


async def merged(
    streams: Sequence[AsyncIterator[Any]],
) -> AsyncIterator[tuple[int, Any]]:
    """``(choice, item)`` from every stream as items arrive; closing this closes (aborts) them all."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item))
        except Exception as exc:  # handed to the consumer, raised there
            queue.put_nowait((i, exc))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    left = len(tasks)
    try:
        while left:
            i, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
