"""Running one request's generation in a worker thread and feeding its events to the event loop.

The model generates synchronously; each request that holds a slot gets its own thread from a pool
of `-np` workers. Events cross to the loop through an asyncio queue. Cancelling (client gone,
timeout, shutdown) sets a `threading.Event` the chat session checks between passes; the slot is
returned only when the thread has finished.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .slots import SlotPool


@dataclass
class Job:
    """A request's generation: `run(cancel, slot)` yields its events; `rank(slot)` scores how much
    of its prompt a free slot already holds (higher wins; None: any slot); `n_prompt` is the prompt's
    length in tokens (APIs that announce it before the reply, e.g. Anthropic's message_start)."""

    run: Callable[[threading.Event, int], Iterator[Any]]
    rank: Callable[[int], Any] | None = None
    n_prompt: int = 0


class Failed:
    """An exception raised inside the worker thread, delivered in order with the events."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_END = object()
PING = object()


class Generation:
    """One running generation: iterate it on the loop; `cancel()` from anywhere."""

    def __init__(self, deadline: float) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancel_event = threading.Event()
        self.deadline = deadline
        self.timed_out = False
        self.finished = asyncio.Event()
        self.started = time.monotonic()

    def cancel(self) -> None:
        self.cancel_event.set()

    def expire(self) -> None:
        self.timed_out = True
        self.cancel_event.set()

    async def events(self, ping_s: float | None = None) -> AsyncIterator[Any]:
        """Events in order; a `Failed` item carries a worker exception; `PING` when silent for ping_s."""
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), ping_s) if ping_s else await self.queue.get()
            except asyncio.TimeoutError:
                yield PING
                continue
            if item is _END:
                return
            yield item


class Runner:
    """Slots, worker threads and the set of live generations (so shutdown can cancel them all)."""

    def __init__(self, n_slots: int, max_queue: int) -> None:
        self.slots = SlotPool(n_slots, max_queue)
        self.pool = ThreadPoolExecutor(max_workers=n_slots, thread_name_prefix="clover-slot")
        self.live: set[Generation] = set()

    async def start(self, job: Job, timeout_s: float) -> Generation:
        """Wait for a slot (503 when the line is full or the wait outlasts the timeout), then run `job`."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        slot = await self.slots.acquire(timeout_s, job.rank)
        gen = Generation(deadline)
        self.live.add(gen)
        timer = loop.call_later(max(0.0, deadline - time.monotonic()), gen.expire)

        def done() -> None:
            timer.cancel()
            self.live.discard(gen)
            self.slots.release(slot)
            gen.finished.set()
            gen.queue.put_nowait(_END)

        def post(fn: Callable[..., None], *args: Any) -> None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop is gone: the server is shutting down
                gen.cancel_event.set()

        def work() -> None:
            try:
                for event in job.run(gen.cancel_event, slot):
                    post(gen.queue.put_nowait, event)
            except BaseException as exc:  # noqa: BLE001 - handed to the request, never lost
                post(gen.queue.put_nowait, Failed(exc))
            finally:
                post(done)

        try:
            self.pool.submit(work)
        except RuntimeError:
            done()
            raise
        return gen

    def cancel_all(self) -> None:
        for gen in list(self.live):
            gen.cancel()

    def close(self) -> None:
        self.cancel_all()
        self.pool.shutdown(wait=False, cancel_futures=True)
