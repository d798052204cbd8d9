"""Payloads encrypted at rest (CAIRN_PAYLOAD_KEYS): a run's input, state, window, journaled
results, effect result, signal and steer payloads, approval requests and decisions and
events reach Postgres and Redis
sealed, and read back open; without the key nothing opens and the error says so;
`cairn db rotate-key` seals them all again under a new first key."""

from __future__ import annotations

import glob
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import cairn
from cairn.client import Client
from cairn.core import sealing
from cairn.core.sealing import KeyRing, PayloadKeyError, new_key
from cairn.core.settings import Settings
from cairn.steps import Context, StepResult, workflow
from cairn.store import Leases
from cairn.store.db import Database
from cairn.store.events import RedisEvents
from cairn.store.sealed import reseal
from cairn.workers import loop
from cairn.workers.outbox import Outbox

K1 = f"k1:{new_key()}"
K2 = f"k2:{new_key()}"
# One secret per place a payload is kept; none may appear in a dump of either server.
SECRETS = {
    "input": "sesame-input-4f1c",
    "state": "sesame-state-9a2b",
    "window": "sesame-window-7d3e",
    "call": "sesame-call-1b8a",
    "once": "sesame-once-5c6d",
    "event": "sesame-event-2e9f",
    "signal": "sesame-signal-8f0a",
    "steer": "sesame-steer-3a7c",
    "request": "sesame-request-6b4e",
}

flow = workflow("sealed_flow")


@flow.step()
def first(ctx: Context) -> StepResult:
    heard = ctx.messages()
    said = ctx.call("lookup", lambda: {"found": SECRETS["call"]})
    kept = ctx.once(lambda key: {"sent": SECRETS["once"]})
    ctx.emit("progress", {"note": SECRETS["event"]})
    return StepResult.wait(
        "go",
        cursor="second",
        state={"secret": SECRETS["state"], "heard": heard, "said": said, "kept": kept},
        window=[{"role": "user", "content": SECRETS["window"]}],
        request={"tool": "open_vault", "args": {"code": SECRETS["request"]}},
    )


@flow.step()
def second(ctx: Context) -> StepResult:
    return StepResult(cursor=cairn.DONE, state={"signal": ctx.signal})


@pytest.fixture
def keys() -> Iterator[None]:
    sealing.use(KeyRing(K1))
    yield
    sealing.use(None)


def _dump_postgres(url: str) -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_dump")) or [shutil.which("pg_dump")]
    return subprocess.run(
        [str(found[-1]), "--data-only", url], capture_output=True, text=True, check=True
    ).stdout


def _dump_redis(leases: Leases) -> str:
    r = leases.client
    return "\n".join(
        repr(r.xrange(key)) if r.type(key) == b"stream" else repr(r.dump(key))
        for key in r.scan_iter()
    )


def _sealed_run(settings: Settings, store: Any, leases: Leases) -> tuple[str, Client]:
    deps = loop.Deps(
        settings=settings,
        store=store,
        leases=leases,
        model=None,
        events=Outbox(RedisEvents(leases.client), settings),
    )
    client = Client(settings=settings, store=store, send=lambda run_id, priority: None)
    run_id = f"sealed-{uuid.uuid4().hex[:8]}"
    assert store.create_run(run_id, "sealed_flow", {"secret": SECRETS["input"]})
    client.steer(run_id, {"note": SECRETS["steer"]})
    loop.run(run_id, deps)
    # The approval's decision is the signal: its payload in signals and in the audit row.
    [asked] = client.approvals()
    client.decide(asked.approval_id, "edit", args={"secret": SECRETS["signal"]})
    assert loop.run(run_id, deps) == cairn.RunStatus.DONE
    assert deps.events is not None
    assert deps.events.flush()
    return run_id, client


def test_every_payload_is_sealed_in_both_servers_and_opens_for_the_reader(
    keys: None, settings: Settings, store: Any, leases: Leases, db_url: str
) -> None:
    run_id, client = _sealed_run(settings, store, leases)

    dumped = _dump_postgres(db_url) + _dump_redis(leases)
    assert [k for k, secret in SECRETS.items() if secret in dumped] == []
    assert '"cairn.sealed": "v1.k1.' in dumped  # sealed, not left out

    run = client.get(run_id)
    assert run is not None
    assert run.input == {"secret": SECRETS["input"]}
    assert run.state["secret"] == SECRETS["state"]
    assert run.state["heard"] == [{"note": SECRETS["steer"]}]
    assert run.state["said"] == {"found": SECRETS["call"]}
    assert run.state["kept"] == {"sent": SECRETS["once"]}
    assert run.state["signal"]["args"] == {"secret": SECRETS["signal"]}
    approval = client.approval(run.state["signal"]["approval_id"])
    assert approval is not None and approval.request["args"] == {"code": SECRETS["request"]}
    assert approval.decision is not None
    assert approval.decision.payload["args"] == {"secret": SECRETS["signal"]}
    assert [c.result for c in client.calls(run_id) if c.name == "lookup"] == [
        {"found": SECRETS["call"]}
    ]
    events = list(client.events(run_id, timeout=1))
    assert {"note": SECRETS["event"]} in [e.data for e in events if e.kind == "progress"]
    window = store.load(run_id).window
    assert {"role": "user", "content": SECRETS["window"]} in window
    # The SSE server passes an event's JSON on as the stream holds it: opened, not sealed.
    assert all(sealing.SEALED not in e.json() for e in events)

    # Without the key nothing opens, and the error names the key to set.
    sealing.use(KeyRing(None))
    with pytest.raises(PayloadKeyError, match="sealed under key 'k1'.*CAIRN_PAYLOAD_KEYS"):
        client.get(run_id)


def test_rotate_key_seals_everything_again_under_the_new_first_key(
    keys: None, settings: Settings, store: Any, leases: Leases, db_url: str
) -> None:
    run_id, client = _sealed_run(settings, store, leases)
    sealing.use(KeyRing(f"{K2},{K1}"))  # the new key first, the old one still opening
    db = Database(db_url)
    try:
        done = reseal(db, batch=2)  # small batches: the loop goes round
        assert reseal(db) == dict.fromkeys(done, 0)  # nothing left under k1
    finally:
        db.close()
    assert done["runs.input"] >= 1 and done["checkpoints.state"] >= 1
    assert done["journal.result"] >= 1 and done["steer_messages.message"] >= 1
    dumped = _dump_postgres(db_url)
    assert '"v1.k1.' not in dumped and '"v1.k2.' in dumped

    sealing.use(KeyRing(K2))  # the old key gone: everything still opens
    run = client.get(run_id)
    assert run is not None and run.state["secret"] == SECRETS["state"]


def test_a_key_ring_says_what_is_wrong_with_it_in_one_line() -> None:
    for spec, words in (
        ("nocolon", "want comma-separated <id>:<key>"),
        ("k1:short", "not 32 bytes"),
        (f"{K1},{K1}", "appears twice"),
    ):
        with pytest.raises(PayloadKeyError, match=words) as caught:
            KeyRing(spec)
        assert "\n" not in str(caught.value) and new_key()[:8] not in str(caught.value)
    ring = KeyRing(K1)
    assert "k1" in repr(ring) and K1.split(":")[1] not in repr(ring)
    sealed = ring.seal({"a": 1})
    assert KeyRing(f"{K2},{K1}").load(sealed) == {"a": 1}  # an older key still opens
    tampered = {sealing.SEALED: sealed[sealing.SEALED][:-4] + "AAAA"}
    with pytest.raises(PayloadKeyError, match="does not open"):
        ring.load(tampered)
    with pytest.raises(ValueError, match="CAIRN_PAYLOAD_KEYS"):
        Settings(payload_keys="k1:short")
