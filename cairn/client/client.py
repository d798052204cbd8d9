"""Client: what a web app uses to start runs, read them and wait for them. Enqueues by
workflow name.

It needs neither the workflows' code nor Celery's worker: it writes the run to the store
(Postgres, or any store of the contract: cairn.testing.MemoryStore in a test) and sends
one message naming the run (cairn.client.sender). Celery is imported on the first
enqueue. AsyncClient (cairn.client.aio) is its face for asyncio.

Its operations are kept by audience: runs (cairn.client.runs), an operator's
(cairn.client.admin), schedules (cairn.client.schedules) and approvals
(cairn.client.approvals), over what they share (cairn.client.base). Each takes the
decision cairn.client.tenancy.OPERATIONS holds for it before it runs: `enforced` wraps
every public method at the class's creation, and refuses one without a decision.
"""

from __future__ import annotations

from cairn.client.admin import Admin
from cairn.client.approvals import Approvals
from cairn.client.runs import Runs
from cairn.client.schedules import Schedules
from cairn.client.tenancy import enforced


@enforced
class Client(Runs, Admin, Schedules, Approvals):
    """Enqueue, get and list runs.

        with cairn.Client() as client:            # CAIRN_DATABASE_URL, CAIRN_BROKER_URL
            run_id = client.enqueue("invoice", {"customer": "acme", "email": "a@acme.test"})
            print(client.get(run_id).status)

    URLs not given come from the environment (Settings.from_env()).

    What each kind of operation returns: one that creates a run, its id (enqueue, fork);
    one that changes a run, the Run as it stands after (cancel, rewind, resolve, wait);
    one that records something, whether it was new (signal: False for a signal id sent
    before); a read, Runs (get, list, children, forks, replay) or typed records
    (history: StepRecord, calls: CallRecord). An unknown run is UnknownRun, but for get
    (None) and the reads of lists ([]).

    Args:
        store: the runs' store (any of the contract, store/contract.py); default: a
            PgStore on the database URL, with a pool of pool_size connections.
        send: how a run's message is sent, send(run_id, priority); default: Celery's
            producer on the broker URL, for a PgStore. A test on cairn.testing.MemoryStore
            passes cairn.testing.LocalWorker's, which runs the runs in process.
        events: where the runs' live events are read (Client.events); default: Redis at
            the Redis URL. A LocalWorker's `events` in a test.
        tenant: act for this tenant only: its enqueues are the tenant's runs, and its
            reads, lists, signals, cancels and steers see that tenant's runs alone
            (another's is UnknownRun, or absent from a list); an admin's operation
            (replay, the schedules, a tenant's limits) raises Forbidden. Each
            operation's decision: cairn.client.tenancy.OPERATIONS. None: every run.
    """
