"""What every part of a Client shares: its store, how it sends a run's message, the
tenant it acts for and the token it names in an audit row, and what it closes.

Client (cairn.client.client) is this with its operations by audience: runs
(cairn.client.runs), an operator's (cairn.client.admin), schedules
(cairn.client.schedules), approvals (cairn.client.approvals). Who may call each is
cairn.client.tenancy's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Self

from cairn.client.sender import Sender, no_broker
from cairn.core import tracing
from cairn.core.errors import InvalidInput
from cairn.core.inputs import TENANT_KEY, check_tenant
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store.checkpoints import PgStore
from cairn.store.db import Database

if TYPE_CHECKING:
    from cairn.store.contract import CheckpointStore
    from cairn.store.events import RedisEvents
    from cairn.workers.outbox import EventLog


# Between a tenant and its debounce key in the stored key: a character no key or tenant
# has, so two tenants' keys never collapse into one run.
TENANT_SEP = "\x1f"


class ClientBase:
    """A Client's state; its operations are the mixins' (see Client for the arguments)."""

    def __init__(
        self,
        database_url: str | None = None,
        broker_url: str | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
        store: CheckpointStore | None = None,
        send: Callable[[str, int], None] | None = None,
        events: EventLog | None = None,
        tenant: str | None = None,
    ) -> None:
        self.tenant = check_tenant(tenant) if tenant is not None else None
        # The API token a server's per-request view acts for (None: none, or not told):
        # the audit rows it writes name it.
        self.token_id: str | None = None
        self._view = False  # a for_tenant() view closes nothing: its origin owns it all
        base = settings or Settings.from_env()
        self.settings = base.with_options(database_url=database_url, broker_url=broker_url)
        s = self.settings
        self._db: Database | None = None  # made here, so closed here
        if store is None:
            self._db = Database(
                s.database_url,
                max_size=pool_size,
                give_up_after=s.client_give_up_after,
                prepare=s.database_prepare,
                listen_url=s.listen_url,  # its waits' one connection
            )
            store = PgStore(self._db)
        self.store: CheckpointStore = store
        # Celery's producer only for runs a fleet reads from Postgres; any other store
        # has no broker unless given one.
        self._sender = Sender(s) if send is None and isinstance(store, PgStore) else None
        self._send = send or (self._sender.send if self._sender else no_broker)
        tracing.setup(self.settings, "cairn-client")  # CAIRN_TRACING: spans for enqueues
        self._event_log = events
        self._redis_log: RedisEvents | None = None  # Redis, on the first events()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def for_tenant(self, tenant: str | None, *, token_id: str | None = None) -> Self:
        """This Client acting for one tenant (None: for every tenant, an admin's), on the
        same pool, producer and reader: a server's per-request view (closing it closes
        nothing).

        Args:
            tenant: the tenant whose runs the view reaches; None: every run.
            token_id: the API token the request proved itself with (`cairn tokens`), which
                the audit rows the view writes name (an approval's decision).

        Raises:
            InvalidInput: a tenant name that is none.
        """
        view = copy.copy(self)
        view.tenant = check_tenant(tenant) if tenant is not None else None
        view.token_id, view._view = token_id, True
        return view

    def close(self) -> None:
        """Close what this Client opened: its pool, its producer, its Redis reader (a
        store or an event log it was given stays open)."""
        if self._view:
            return
        if self._db is not None:
            self._db.close()
        if self._sender is not None:
            self._sender.close()
        if self._redis_log is not None:
            self._redis_log.close()

    def _by(self, by: str | None) -> str:
        """Who an audit row says acted: `by` if given, else the token this Client acts
        for, its tenant, or the admin."""
        if by is not None:
            return by
        if self.token_id is not None:
            return f"token {self.token_id}"
        return f"tenant {self.tenant}" if self.tenant is not None else "admin"

    def _debounced(
        self, debounced: tuple[str, float, float | None] | None
    ) -> tuple[str, float, float | None] | None:
        """The debounce options with the key this Client's tenant stores it under."""
        if debounced is None or self.tenant is None:
            return debounced
        key, wait, max_wait = debounced
        return f"{self.tenant}{TENANT_SEP}{key}", wait, max_wait

    def _tenant_key(self, key: str | None, limit: int, prio: int) -> tuple[str | None, int, int]:
        """The flow options with the tenant's concurrency key (CAIRN_TENANT_CONCURRENCY) for
        a run of a tenant that has no key of its own."""
        if key is None and self.tenant is not None and self.settings.tenant_concurrency > 0:
            return f"{TENANT_KEY}{self.tenant}", self.settings.tenant_concurrency, prio
        return key, limit, prio

    def _on_postgres(self) -> None:
        if not isinstance(self.store, PgStore):
            raise InvalidInput(
                f"enqueue(connection=...) writes the run in your Postgres transaction: it "
                f"needs a Client on Postgres, not {type(self.store).__name__}"
            )

    def _send_admitted(self, workflow: str, key: str, run_id: str | None = None) -> bool:
        """Send the key's runs admitted and not sent yet (a key may be shared by tenants:
        not the tenant's send, which would hide another's run); whether run_id was one."""
        sent = False
        for admitted, prio in self.store.admitted(workflow, key):
            self._send(admitted, prio)
            sent = sent or admitted == run_id
        return sent

    def _send_rearmed(self, rearmed: Iterable[str]) -> None:
        """Send the runs a change re-armed (a run queued behind its concurrency key is
        left to the key's release)."""
        for rid in rearmed:
            run = self.store.get(rid)
            if run is not None and run.status == RunStatus.PENDING:
                self._send(rid, run.priority)

    def _events(self) -> EventLog:
        if self._event_log is not None:
            return self._event_log
        if self._redis_log is None:
            from cairn.store.events import RedisEvents

            self._redis_log = RedisEvents.from_url(self.settings.redis)
        return self._redis_log
