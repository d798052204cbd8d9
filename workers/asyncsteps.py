"""Async steps: each process's one event loop, on a daemon thread, and the pool thread's
wait for an async step's coroutine to finish on it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
import threading
from typing import Any

_loop_lock = threading.Lock()
_shared_loop: asyncio.AbstractEventLoop | None = None


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's one event loop for async steps, on a daemon thread of its own,
    started at the first async step. One loop, not one per pool thread: async clients
    kept in module globals (pydantic-ai's model, an httpx.AsyncClient) hold connections
    that belong to the loop that opened them, and a second loop reusing one fails."""
    global _shared_loop
    with _loop_lock:
        if _shared_loop is None or _shared_loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="cairn-async-steps", daemon=True).start()
            _shared_loop = loop
        return _shared_loop


def _forget_loop() -> None:
    global _shared_loop
    _shared_loop = None  # a forked pool child starts its own (the thread did not follow)


os.register_at_fork(after_in_child=_forget_loop)


def wait_for(step: Any) -> Any:
    """Run an async step's coroutine on the process's event loop and wait for it. The
    pool thread blocks here while the loop runs this step beside other async steps; the
    step's task runs in this thread's context as it is now, so it sees cairn.current()."""
    loop = _event_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise RuntimeError("an async step cannot be run from inside cairn's own event loop")
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    async def run() -> None:
        try:
            result = await step
        except BaseException as exc:  # noqa: BLE001 (all of it goes to the waiting thread,
            done.set_exception(exc)  # SystemExit too: raised in the loop, it would stop it)
        else:
            done.set_result(result)

    context = contextvars.copy_context()
    loop.call_soon_threadsafe(lambda: loop.create_task(run(), context=context))
    return done.result()
