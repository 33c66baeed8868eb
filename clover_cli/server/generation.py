"""Running one request's generation in a worker thread and feeding its events to the event loop.

The model generates synchronously; each request that holds a slot gets its own thread from a pool
of `-np` workers. Events cross to the loop through an asyncio queue. Cancelling (client gone,
timeout, shutdown) sets a `threading.Event` the chat session checks between passes; the slot is
returned only when the thread has finished. A generation cut by shutdown ends its event stream at
once (the thread stops at its next check), so the reply can say it was cut without waiting a pass.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from clover_runtime.text.reply import Finished

from . import access_log
from .errors import APIError
from .slots import RETRY_AFTER_S, SlotPool

SHUTTING_DOWN = "server_shutting_down"


def shutting_down_error(cut: bool = False) -> APIError:
    """What a request gets once shutdown has begun: a reply it cut (`cut`), a queued or a new one."""
    what = "this reply was cut before it finished" if cut else "no new requests are taken"
    return APIError(503, f"the server is shutting down: {what}; retry on a running server",
                    type_="server_error", headers={"Retry-After": str(RETRY_AFTER_S)},
                    extra={"code": SHUTTING_DOWN})


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
        self.cut_by_shutdown = False
        self.finished = asyncio.Event()
        self.started = time.monotonic()

    def cancel(self) -> None:
        self.cancel_event.set()

    def expire(self) -> None:
        self.timed_out = True
        self.cancel_event.set()

    def cut(self) -> None:
        """Shutdown: stop the thread and end the events now; the reply must report it was cut."""
        self.cut_by_shutdown = True
        self.cancel_event.set()
        self.queue.put_nowait(_END)

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
    """Slots, worker threads and the set of live generations (so shutdown can drain and cut them)."""

    def __init__(self, n_slots: int, max_queue: int) -> None:
        self.slots = SlotPool(n_slots, max_queue)
        self.pool = ThreadPoolExecutor(max_workers=n_slots, thread_name_prefix="clover-slot")
        self.live: set[Generation] = set()
        self.stopping = False

    async def start(self, job: Job, timeout_s: float) -> Generation:
        """Wait for a slot (503 when the line is full, the wait outlasts the timeout or the server is
        shutting down), then run `job`."""
        if self.stopping:
            raise shutting_down_error()
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        slot = await self.slots.acquire(timeout_s, job.rank)
        if self.stopping:  # the slot came free after shutdown began: nothing new starts
            self.slots.release(slot)
            raise shutting_down_error()
        gen = Generation(deadline)
        facts = access_log.current()  # the request's log record: the worker thread adds what finished
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
                    if facts is not None and isinstance(event, Finished):
                        facts.finished.append(event)
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

    def begin_shutdown(self) -> None:
        """Nothing new starts, and every request still waiting for a slot is answered 503 now."""
        self.stopping = True
        self.slots.reject_waiters(shutting_down_error)

    def cut_all(self) -> None:
        for gen in list(self.live):
            gen.cut()

    async def drain(self, grace_s: float, hurry: Callable[[], bool] = lambda: False) -> None:
        """Shutdown: let running replies finish for up to `grace_s` seconds (or until `hurry()`),
        then cut the rest, each with an error that says so."""
        self.begin_shutdown()
        deadline = time.monotonic() + grace_s
        while self.live and time.monotonic() < deadline and not hurry():
            await asyncio.sleep(0.02)
        self.cut_all()

    def close(self) -> None:
        self.begin_shutdown()
        self.cut_all()
        self.pool.shutdown(wait=False, cancel_futures=True)
