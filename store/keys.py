"""Every Redis key cairn uses, and why its TTL is what it is."""

from __future__ import annotations

PREFIX = "cairn"


def lease(run_id: str) -> str:
    """Owner token "<owner>|<epoch>"; TTL = lease TTL, renewed by the heartbeat."""
    return f"{PREFIX}:lease:{run_id}"


# An idle run's counter lasts this long after its last acquisition.
EPOCH_TTL = 7 * 24 * 3600.0


def epoch(run_id: str) -> str:
    """Fencing counter, INCR per acquisition. Deleted with the lease when the run ends,
    and after EPOCH_TTL without an acquisition, so Redis does not keep a key for every
    run there ever was. A counter gone (or lost with Redis's data) is survived: the claim
    finds the stored epoch not below the new one, and the run is leased again above it."""
    return f"{PREFIX}:epoch:{run_id}"


def sent(run_id: str) -> str:
    """A resume message was sent for the run and no worker has taken it yet: set NX by
    the reaper and by a resend after a lost pool process, deleted by the next acquire.
    While it lives the reaper sends no other, so a queue that backs up under many
    crashes is not flooded with duplicates (each one a slot spent, and a longer wait
    for the rest). Its TTL bounds the wait for a message that was lost after all."""
    return f"{PREFIX}:sent:{run_id}"


def events(run_id: str) -> str:
    """The run's event stream (run events, model tokens): bounded by MAXLEN, expiring
    CAIRN_EVENTS_TTL after its last event. Live delivery only: what must outlive Redis is
    in Postgres (the journal, the step history), and readers rebuild from there."""
    return f"{PREFIX}:events:{run_id}"


def event_count(run_id: str) -> str:
    """How many events the run's steps appended (its cap counts these); same TTL."""
    return f"{PREFIX}:events:{run_id}:n"


def event_epoch(run_id: str) -> str:
    """The newest lease epoch that wrote to (or took over) the run's stream: an older
    writer's events are refused from then on (store/lua/emit.lua); same TTL."""
    return f"{PREFIX}:events:{run_id}:epoch"


# Every run a delivery holds (a sorted set: run id, scored by when the delivery took it,
# in Redis's ms); a delivery's release takes its run out. A run left in it past a lease
# TTL without a live lease lost its worker, whatever its status: the reaper sends it
# again. It is how a run whose worker died right after its last commit (done in
# Postgres, its last events unwritten, its message unacked with the dead worker) is
# delivered again, and its stream told. Bounded by the runs in flight.
DELIVERIES = f"{PREFIX}:deliveries"

# Each worker's beat (a sorted set: "<code version>|<node name>", scored by its last beat
# in Unix seconds), written by its main process every fleet.BEAT_EVERY seconds. What
# `cairn deploy status` lists and the orphan report of pinned runs reads. A worker that
# stops well takes itself out; one killed is pruned after fleet.KEEP.
WORKERS = f"{PREFIX}:workers"


# The payload key ids workers lacked (a sorted set: key id, scored by when a worker last
# met one, in Unix seconds), added as a worker hands back a run a payload of which is
# sealed under a key its CAIRN_PAYLOAD_KEYS lacks. `cairn worker --check` fails while an
# id its own key ring lacks was met within fleet.KEYS_SEEN; older ones are pruned.
KEYS_MISSING = f"{PREFIX}:keys:missing"


def orphan_told(version: str) -> str:
    """The reaper told the operator that this version's pinned runs have no worker: set
    NX with a TTL (fleet.TELL_EVERY), so the log line comes once a while, not each pass."""
    return f"{PREFIX}:orphaned:{version}"
