"""LocalWorker: the fleet of a unit test. What a Client on a MemoryStore enqueued runs in
this process, on the calling thread, through the real loop (cairn.workers.loop.run), with
the in-memory leases: no Postgres, Redis, broker or worker process (procrastinate's
in-memory connector and its worker's run-once mode, in small).

    worker = LocalWorker()
    with cairn.Client(store=worker.store, send=worker.send) as client:
        run_id = client.enqueue("greet", {"name": "Ada"})
        worker.run_until_idle()
        assert client.get(run_id).status == "done"

Its send() is the broker: the Client's messages and the loop's own (a child spawned, a
parent woken, a concurrency key's next run) queue here, and run_until_idle() delivers
them as the run task would, a retry after its delay on the worker's clock.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from typing import TYPE_CHECKING

from cairn.core.errors import Deferred, HandOff, Misrouted, RetryLater, Superseded
from cairn.core.settings import Settings
from cairn.steps import registry
from cairn.testing.memory import Clock, MemoryEvents, MemoryLeases, MemoryStore
from cairn.workers import loop
from cairn.workers.middleware import NONE, Chain
from cairn.workers.outbox import Outbox

if TYPE_CHECKING:
    from cairn.steps.model import ModelClient
    from cairn.store.contract import CheckpointStore

# The reaper's look for signals left unseen, with its other looks (runs quiet for
# this long) pushed out of reach: a local worker has no lost workers or messages.
_NEVER = 1e9


class LocalWorker:
    """Runs what was sent to it, in process, until nothing is due.

    store: where the runs are (a new MemoryStore on `clock` by default; any store of the
    contract will do). clock: seconds, as time.time; a ManualClock lets a test move time
    past a retry's delay or a wait's timeout. events: keep the runs' live events in
    `self.events` (a MemoryEvents; give it to cairn.Client(events=...) to read them).
    model: the steps' ModelClient (None: a step that calls ctx.model fails).
    """

    def __init__(
        self,
        store: CheckpointStore | None = None,
        *,
        clock: Clock | None = None,
        settings: Settings | None = None,
        model: ModelClient | None = None,
        middleware: Chain = NONE,
        events: bool = False,
    ) -> None:
        self.clock: Clock = clock or time.time
        self.store: CheckpointStore = store if store is not None else MemoryStore(self.clock)
        self.settings = settings or Settings()
        # The version the runs it starts and the steps it saves record, as a worker's.
        self.settings = self.settings.with_options(
            code_version=registry.code_version(self.settings.code_version)
        )
        self.leases = MemoryLeases(self.clock)
        self.events = MemoryEvents(self.leases, self.clock) if events else None
        self.deps = loop.Deps(
            settings=self.settings,
            store=self.store,
            leases=self.leases,
            model=model,
            middleware=middleware,
            events=Outbox(self.events, self.settings) if self.events is not None else None,
            send=lambda run_id, resume, priority: self.send(run_id, priority),
        )
        self._ready: collections.deque[str] = collections.deque()
        self._later: list[tuple[float, int, str]] = []  # (due on the clock, order, run id)
        self._order = itertools.count()
        self.deliveries = 0

    def send(self, run_id: str, priority: int = 0) -> None:
        """Queue one delivery of run_id: the broker, as Client(send=...) and the loop
        use it (priority only orders a real broker's queues)."""
        self._ready.append(run_id)

    def run_until_idle(self, max_deliveries: int = 10_000) -> int:
        """Deliver what was sent, and what that sends, until nothing is due now; returns
        how many deliveries ran. A step's retry is due after its delay, and a waiting run
        once its timeout has passed (as beat's wake pass finds it: strictly after), on the
        worker's clock: move it (ManualClock.advance), then call this again. Raises RuntimeError past max_deliveries (a run that never
        settles)."""
        ran = 0
        while self._due():
            if ran >= max_deliveries:
                raise RuntimeError(
                    f"still busy after {ran} deliveries: a run that never settles? "
                    f"{list(self._ready)[:5]}"
                )
            self._deliver(self._ready.popleft())
            ran += 1
        return ran

    def _due(self) -> bool:
        """Whether a delivery is due, moving what came due into the ready queue: retries
        past their delay, and waiting runs whose time came (beat's wake pass)."""
        now = self.clock()
        while self._later and self._later[0][0] <= now:
            self._ready.append(heapq.heappop(self._later)[2])
        if not self._ready:
            # Sleeps and wait timeouts, runs stopped over a tenant's budget per day whose
            # next day came (beat's wake pass), then signals left unseen.
            self._ready.extend(self.store.wake())
            self._ready.extend(self.store.roll_budgets())
            after: str | None = ""
            while after is not None:
                rows, after = self.store.stalled(_NEVER, after=after)
                self._ready.extend(row["run_id"] for row in rows)
        return bool(self._ready)

    def _deliver(self, run_id: str) -> None:
        """One delivery, its outcomes handled as the run task handles them."""
        self.deliveries += 1
        try:
            loop.run(run_id, self.deps)
        except RetryLater as exc:
            self._after(exc.delay, run_id)
        except Deferred:  # held by a lease of another worker on the same leases
            self._after(self.settings.defer_seconds, run_id)
        except HandOff:
            self._ready.append(run_id)
        except Superseded:
            pass  # another worker has the run
        except Misrouted:
            pass  # pinned to another code version: a worker of that version goes on with it

    def _after(self, seconds: float, run_id: str) -> None:
        heapq.heappush(self._later, (self.clock() + seconds, next(self._order), run_id))
