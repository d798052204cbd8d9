"""Flow between runs: the children a step spawns, the parent a stopped child wakes, the
next run of a concurrency key a stopped run admits. Each sent after the commit that made
it due; the reaper sends what a crash in between lost."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cairn.core import logs, tracing
from cairn.core.errors import CairnError
from cairn.core.inputs import check_input, check_run_id
from cairn.core.records import Checkpoint, Spawned
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps import registry

if TYPE_CHECKING:
    from cairn.workers.loop import Deps

logger = logging.getLogger(__name__)

# Puts a run's message on the broker: (run id, on the resume queue?, priority).
Send = Callable[[str, bool, int], None]


def spawned(cp: Checkpoint, spawn: registry.Spawn, visit: int, settings: Settings) -> Spawned:
    """A step's spawn as the save writes it: each child's run id (the parent's, the step's
    cursor and visit, the child's key: a replay makes the same ones) and checked input."""
    depth = cp.depth + 1
    if depth > settings.max_spawn_depth:
        raise CairnError(
            f"run {cp.run_id}: a spawn at depth {depth}, over CAIRN_MAX_SPAWN_DEPTH="
            f"{settings.max_spawn_depth} (does a workflow spawn itself without end?)"
        )
    children = []
    for i, child in enumerate(spawn.children):
        registry.get(child.workflow)  # UnknownWorkflow: the run fails, nothing is spawned
        key = child.key if child.key is not None else str(i)
        run_id = check_run_id(f"{cp.run_id}.{cp.cursor}.{visit}.{key}")
        data = check_input(dict(child.input), settings.max_input_bytes)
        children.append((run_id, child.workflow, data))
    # Under the spawning step's span: each child's trace goes on from it.
    return Spawned(tuple(children), spawn.need, depth, tracing.traceparent())


def send_children(spawned: Spawned, send: Send | None) -> None:
    """One message per child, after the save that made them. A crash before the last is
    sent loses nothing: the reaper sends a run that waits for a message it never got."""
    if send is None:
        return
    for run_id, _, _ in spawned.children:
        send(run_id, False, 0)


def resend_children(cp: Checkpoint, deps: Deps) -> None:
    """A parent waiting for its spawn, delivered again (its worker may have died between
    the spawn's save and the children's messages): send the children no worker has
    taken, each at most once per resend window."""
    if deps.send is None:
        return
    seq = int((cp.wait_event or "").rpartition(":")[2])
    window = deps.settings.resend_window
    sent = 0
    for kid in deps.store.children(cp.run_id, seq):
        if kid.status == RunStatus.PENDING and deps.leases.mark_sent(kid.run_id, window):
            deps.send(kid.run_id, False, 0)
            sent += 1
    if sent:
        logger.info(
            "run %s: sent %d child run(s) no worker has taken",
            cp.run_id,
            sent,
            extra=logs.at(cp, "children_resent", n=sent),
        )


def wake_parent(cp: Checkpoint, deps: Deps) -> None:
    """A child stopped: if that gathered its parent's spawn, send the parent a message.
    The reaper sends it too if this is lost (a waiting run with a signal unconsumed)."""
    if cp.parent_id is None or deps.send is None:
        return
    try:
        if deps.store.gathered(cp.parent_id):
            deps.send(cp.parent_id, True, 0)
    except Exception:  # the child's end is saved; the reaper wakes the parent
        logger.warning(
            "run %s: its parent %s was not woken; the reaper will",
            cp.run_id,
            cp.parent_id,
            exc_info=True,
            extra=logs.at(cp, "wake_failed"),
        )


def send_admitted(cp: Checkpoint, deps: Deps) -> None:
    """A run with a concurrency key stopped: its slot went, in the same transaction, to
    the key's next queued run; send that one. The reaper sends it if this is lost (a
    pending run whose message never came)."""
    if cp.concurrency_key is None or deps.send is None:
        return
    try:
        for run_id, priority in deps.store.admitted(cp.workflow, cp.concurrency_key):
            deps.send(run_id, False, priority)
    except Exception:  # the stop is saved; the reaper sends the next run
        logger.warning(
            "run %s: the next run of its concurrency key was not sent; the reaper will",
            cp.run_id,
            exc_info=True,
            extra=logs.at(cp, "admit_failed"),
        )
