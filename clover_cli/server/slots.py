"""A fixed number of generation slots (`-np`) and a bounded line of requests waiting for one.

All methods run on the event loop; worker threads hand slots back with `call_soon_threadsafe`.
A slot is freed only when its generation thread has really stopped, so a client that disconnects
never lets more than `-np` sequences run at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from .errors import APIError

RETRY_AFTER_S = 5


def busy_error(message: str) -> APIError:
    return APIError(503, message, headers={"Retry-After": str(RETRY_AFTER_S)})


class SlotPool:
    """`n_slots` sequences run at once; up to `max_queue` more wait in order; beyond that, 503."""

    def __init__(self, n_slots: int, max_queue: int) -> None:
        self.n_slots = n_slots
        self.max_queue = max_queue
        self._free: list[int] = list(range(n_slots - 1, -1, -1))
        self._waiters: deque[asyncio.Future[int]] = deque()
        self.processing: set[int] = set()

    @property
    def busy(self) -> int:
        return self.n_slots - len(self._free)

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self, timeout: float, rank: Callable[[int], Any] | None = None) -> int:
        """A free slot id; waits in line up to `timeout` seconds; 503 with Retry-After when full.

        Among free slots the one `rank` scores highest wins (the one whose cached prompt this
        request shares most); a request that waited takes the first slot freed."""
        slot = await self._acquire(timeout, rank)
        self.processing.add(slot)
        return slot

    async def _acquire(self, timeout: float, rank: Callable[[int], Any] | None) -> int:
        if self._free and not self.waiting:
            if rank is not None:
                best = max(self._free, key=rank)
                self._free.remove(best)
                return best
            return self._free.pop()
        if self.waiting >= self.max_queue:
            raise busy_error(f"server is busy: {self.n_slots} of {self.n_slots} slots in use and "
                             f"{self.waiting} requests waiting; retry later")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            if fut.done() and not fut.cancelled():
                return fut.result()
            raise busy_error(f"timed out after {timeout:g} s waiting for a free slot; retry later") from None
        except BaseException:  # cancelled (the client left), or refused by reject_waiters
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result())
            raise
        finally:
            if fut in self._waiters and fut.done():
                self._waiters.remove(fut)

    def reject_waiters(self, error: Callable[[], BaseException]) -> None:
        """Answer everyone in line with `error()` at once (the server is shutting down)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error())

    def take(self, slot: int) -> bool:
        """Hold one given slot if it is idle (to save or restore its state); False when it is busy."""
        if slot not in self._free:
            return False
        self._free.remove(slot)
        return True

    def release(self, slot: int) -> None:
        """Give the slot to the oldest live waiter, or put it back."""
        self.processing.discard(slot)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                self.processing.add(slot)
                return
        self._free.append(slot)
