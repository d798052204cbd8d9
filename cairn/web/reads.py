"""The API's reads of runs, from a read replica when CAIRN_DATABASE_READ_URL names one.

A replica lags its primary by the time its WAL takes to arrive (milliseconds on a quiet
link, seconds behind a busy one), so a run just enqueued may not be there yet: a run the
replica does not have is read from the primary, and the run page reads the rest of the
run (steps, calls, children, forks) from whichever had it, so the page is of one moment.
What must see its own write (the answer to a POST, the live stream's end) stays on the
primary.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cairn.client.client import Client
from cairn.core.errors import UnknownRun
from cairn.core.records import Run
from cairn.core.status import RunStatus

T = TypeVar("T")


class Reads:
    """Reads of runs on the replica, or the primary when there is none or it lags."""

    def __init__(self, primary: Client, replica: Client | None = None) -> None:
        self.primary = primary
        self.replica = replica
        # Where a run is looked for, in order.
        self.sources: tuple[Client, ...] = (replica, primary) if replica else (primary,)

    def for_tenant(self, tenant: str) -> Reads:
        """These reads acting for one tenant (its runs only), on the same pools."""
        replica = self.replica.for_tenant(tenant) if self.replica else None
        return Reads(self.primary.for_tenant(tenant), replica)

    def list(self, *args: Any, **kwargs: Any) -> builtins.list[Run]:
        return self.sources[0].list(*args, **kwargs)

    def counts(self) -> dict[RunStatus, int]:
        return self.sources[0].counts()

    def holding(self, run_id: str) -> tuple[Client, Run] | None:
        """The run, and the client that has it (the replica unless it lags); None if
        neither has it."""
        for client in self.sources:
            run = client.get(run_id)
            if run is not None:
                return client, run
        return None

    def get(self, run_id: str) -> Run | None:
        found = self.holding(run_id)
        return found[1] if found else None

    def of_run(self, run_id: str, read: Callable[[Client], Sequence[T]]) -> builtins.list[T]:
        """read(client) for the run: the replica's, or the primary's if the replica has
        not got the run yet. Raises UnknownRun if neither has it."""
        for client in self.sources:
            found = list(read(client))
            if found or client.get(run_id) is not None:  # a run without any is no lag
                return found
        raise UnknownRun(f"no run {run_id!r}")

    def close(self) -> None:
        """Close the replica's pool (the primary is the app's)."""
        if self.replica is not None:
            self.replica.close()


def replica_client(primary: Client, pool_size: int) -> Client | None:
    """A Client on the read replica the primary's settings name, or None."""
    url = primary.settings.database_read_url
    if not url:
        return None
    return Client(settings=primary.settings.with_options(database_url=url), pool_size=pool_size)
