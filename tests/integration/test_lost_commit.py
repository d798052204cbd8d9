"""A commit whose reply is lost: the statement committed, then the link dropped. The store
retries, and each write must then recognise its own row instead of calling itself
fenced. A proxy in front of Postgres (cairn.testing.proxy) makes it happen every time."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from cairn.core.records import Call, Checkpoint
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store import Database, PgStore
from cairn.testing.proxy import CutProxy


@pytest.fixture
def proxy(settings: Settings) -> Iterator[CutProxy]:
    where = urlsplit(settings.database_url)
    with CutProxy(where.hostname or "127.0.0.1", where.port or 5432) as proxy:
        yield proxy


@pytest.fixture
def cut_store(settings: Settings, proxy: CutProxy) -> Iterator[PgStore]:
    db = Database(proxy.url(settings.database_url), give_up_after=10, prepare=False)
    yield PgStore(db)
    db.close()


def _claimed(store: PgStore) -> Checkpoint:
    assert store.create_run("lc", "probe", {}, "one")
    cp = store.claim("lc", 1)
    assert cp is not None
    return cp


def test_a_save_whose_commit_reply_was_lost_is_still_saved(
    cut_store: PgStore, store: PgStore, proxy: CutProxy
) -> None:
    cp = _claimed(cut_store)
    nxt = dataclasses.replace(cp, seq=1, cursor="two", status=RunStatus.RUNNING)
    proxy.arm(b"INSERT INTO checkpoints AS c")
    saved = cut_store.save(nxt, cp)  # not StaleWrite: the row it finds is its own
    assert proxy.cuts == 1
    assert saved.cancel_reason is None
    now = store.load("lc")
    assert now is not None and (now.seq, now.cursor, now.epoch) == (1, "two", 1)
    assert len(store.history("lc")) == 1  # written once, by the first try


def test_a_journal_record_whose_commit_reply_was_lost_is_still_recorded(
    cut_store: PgStore, store: PgStore, proxy: CutProxy
) -> None:
    cp = _claimed(cut_store)
    proxy.arm(b"INSERT INTO journal")
    assert cut_store.record_call(cp, 0, Call(pos=0, name="tool", result={"ok": 1}))
    assert proxy.cuts == 1
    assert store.journal("lc", "one", 0) == [Call(pos=0, name="tool", result={"ok": 1})]


def test_an_intent_whose_commit_reply_was_lost_is_still_this_writers(
    cut_store: PgStore, store: PgStore, proxy: CutProxy
) -> None:
    cp = _claimed(cut_store)
    proxy.arm(b"INSERT INTO effects AS e (key, run_id, result, epoch, done)")
    assert cut_store.record_intent(cp, "k") == ("written", None)  # not "open": unknown
    assert proxy.cuts == 1
    assert [i["key"] for i in store.open_intents("lc")] == ["k"]
