"""A worker's part in a deploy: it beats its code version into Redis (what `cairn deploy
status` lists), drains on a remote command (`cairn deploy drain VERSION`), and the
reaper's pass reports pinned runs whose version has no live worker (CAIRN_PIN_ORPHAN_AFTER).

Draining stops a worker taking runs from the shared queues (new runs, and resumes of runs
any version goes on with) and keeps it on its version's queue, where its pinned runs come
back after a wait, a sleep, a retry or the reaper: it finishes them and takes nothing new.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from celery.worker.control import control_command

from cairn.core import logs
from cairn.core.errors import CairnError
from cairn.store.fleet import BEAT_EVERY, Fleet
from cairn.workers import broker

if TYPE_CHECKING:
    from cairn.core.settings import Settings
    from cairn.store.contract import Maintenance

logger = logging.getLogger(__name__)

DRAIN_COMMAND = "cairn_drain"
# The queues a draining worker stops consuming: all but the control queue (what an older
# beat sent there) and its version's own.
SHARED = (broker.RUNS, broker.HIGH, broker.RESUME)


def start_beats(settings: Settings, node: str) -> threading.Event:
    """Beat this worker's version every BEAT_EVERY seconds on a daemon thread; set the
    event returned to stop (its entry is then taken out)."""
    version = settings.code_version or ""
    fleet, stop = Fleet.from_url(settings.redis), threading.Event()

    def beat() -> None:
        while True:
            try:
                fleet.beat(version, node)
            except CairnError as exc:  # Redis away: the next beat tells again
                logger.warning("worker beat not written: %s", exc, extra=logs.run(None, "beat"))
            if stop.wait(BEAT_EVERY):
                break
        try:
            fleet.gone(version, node)
        except CairnError:
            pass  # its entry ages out of the live window instead
        fleet.close()

    threading.Thread(target=beat, name="cairn-fleet-beat", daemon=True).start()
    return stop


@control_command(args=[("version", str)], signature="<version>")  # type: ignore[untyped-decorator]
def cairn_drain(state: Any, version: str, **_: object) -> dict[str, Any]:
    """`cairn deploy drain VERSION`, broadcast: a worker of that version stops consuming
    the shared queues and keeps its version's; the others answer and do nothing."""
    mine = state.consumer.app.cairn.settings.code_version
    if mine != version:
        return {"ok": f"version {mine}: not draining"}
    for queue in SHARED:
        state.consumer.call_soon(state.consumer.cancel_task_queue, queue)
    logger.warning(
        "draining: no new runs taken; finishing the runs pinned to version %s",
        version,
        extra=logs.run(None, "drain", version=version),
    )
    return {"ok": "draining", "version": version}


def report_orphans(store: Maintenance, fleet: Fleet, orphan_after: float) -> list[str]:
    """The versions whose pinned runs have had no live worker for over orphan_after: each
    logged (once every few minutes across the fleet), for an operator to start a worker
    of it or cancel its runs. Returns them."""
    found = [v for v in fleet.versions(store.pinned_runs(), orphan_after) if v.orphaned]
    for v in found:
        if fleet.tell(v.version):
            logger.error(
                "pinned runs orphaned: %d run(s) pinned to code version %s and no live "
                "worker of it for over %.0fs; start a worker with CAIRN_CODE_VERSION=%s, or "
                "cancel them",
                v.pinned,
                v.version,
                orphan_after,
                v.version,
                extra=logs.run(None, "orphaned", version=v.version, runs=v.pinned),
            )
    return [v.version for v in found]
