"""Tenants on both stores (PgStore and MemoryStore, the store contract's fixtures): a run
keeps the tenant it was created for, its children and forks keep it, a tenant's list and
counts hold its runs only, and a run id another tenant holds is a conflict, never that
tenant's run; and a Client with a tenant, on either store, sees and acts on its tenant's
runs alone: another's is UnknownRun (a 404 over HTTP), or absent from a list."""

from __future__ import annotations

import pytest

from cairn.client import Client
from cairn.core.errors import InvalidInput, RunIdConflict, UnknownRun
from cairn.core.records import RunFilter, Spawned, Wait
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store.contract import CheckpointStore
from tests.contract import test_store_contract as contract
from tests.contract.test_store_contract import _advance, _get, _three_steps

# The contract suite's fixtures: each test runs on MemoryStore and on PgStore.
backend = contract.backend
any_store = contract.any_store


def test_a_run_keeps_its_tenant_and_lists_and_counts_are_the_tenants(
    any_store: CheckpointStore,
) -> None:
    assert any_store.create_run("a1", "probe", {"x": 1}, tenant="acme") is True
    assert any_store.create_run("a2", "probe", {"x": 2}, tenant="acme") is True
    assert any_store.create_run("b1", "probe", {"x": 1}, tenant="globex") is True
    assert any_store.create_run("n1", "probe", {"x": 1}) is True
    assert (_get(any_store, "a1").tenant, _get(any_store, "n1").tenant) == ("acme", None)

    def listed(**which: object) -> list[str]:
        return [r.run_id for r in any_store.list_runs(RunFilter(**which))]  # type: ignore[arg-type]

    assert listed(tenant="acme") == ["a2", "a1"]
    assert listed(tenant="globex") == ["b1"]
    assert listed(tenant="acme", status=RunStatus.PENDING) == ["a2", "a1"]
    assert listed(tenant="acme", after="a2") == ["a1"]
    assert listed(tenant="nobody") == []
    assert sorted(listed()) == ["a1", "a2", "b1", "n1"]
    assert [r.tenant for r in any_store.list_runs(RunFilter(tenant="globex"))] == ["globex"]
    assert any_store.counts("acme")["pending"]["n"] == 2
    assert any_store.counts("nobody") == {}
    assert any_store.counts()["pending"]["n"] == 4


def test_a_run_id_another_tenant_holds_is_a_conflict(any_store: CheckpointStore) -> None:
    assert any_store.create_run("r1", "probe", {"x": 1}, tenant="acme") is True
    assert any_store.create_run("r1", "probe", {"x": 1}, tenant="acme") is False
    for other in ("globex", None):
        with pytest.raises(RunIdConflict, match="taken"):
            any_store.create_run("r1", "probe", {"x": 1}, tenant=other)
    assert _get(any_store, "r1").tenant == "acme"


def test_children_and_forks_keep_their_origins_tenant(any_store: CheckpointStore) -> None:
    assert any_store.create_run("p1", "probe", {"x": 1}, "one", tenant="acme") is True
    claimed = any_store.claim("p1", 1)
    assert claimed is not None
    nxt = _advance(claimed, cursor="collect", status=RunStatus.WAITING, visits={"one": 1})
    kids = Spawned((("p1.k.0", "probe", {}), ("p1.k.1", "probe", {})), 2, 1)
    any_store.save(nxt, claimed, wait=Wait(event=f"cairn.children:{nxt.seq}"), spawn=kids)
    assert [(k.run_id, k.tenant) for k in any_store.children("p1")] == [
        ("p1.k.0", "acme"),
        ("p1.k.1", "acme"),
    ]
    assert _get(any_store, "p1.k.0").tenant == "acme"

    _three_steps(any_store, "r1")  # no tenant: its fork has none
    assert any_store.fork("r1", 2, "f1") is True
    assert _get(any_store, "f1").tenant is None
    any_store.create_run("t1", "probe", {"x": 1}, tenant="globex")
    assert _get(any_store, "t1").tenant == "globex"


def test_a_debounced_run_is_its_tenants(any_store: CheckpointStore) -> None:
    run_id, created = any_store.debounce("d1", "probe", {"x": 1}, "k", 30.0, tenant="acme")
    assert created and _get(any_store, run_id).tenant == "acme"


def _client(store: CheckpointStore, tenant: str | None = None) -> Client:
    return Client(store=store, send=lambda run_id, priority: None, tenant=tenant)


def test_a_tenants_client_sees_and_acts_on_its_runs_only(any_store: CheckpointStore) -> None:
    acme, globex, admin = (
        _client(any_store, "acme"),
        _client(any_store, "globex"),
        _client(any_store),
    )
    mine = acme.enqueue("probe", {"x": 1}, run_id="mine")
    theirs = globex.enqueue("probe", {"x": 1}, run_id="theirs")
    assert (admin.get(mine).tenant, admin.get(theirs).tenant) == ("acme", "globex")  # type: ignore[union-attr]
    assert acme.get(mine) is not None and acme.get(theirs) is None
    assert [r.run_id for r in acme.list()] == ["mine"]
    assert acme.list(tenant="globex") == []
    assert {r.run_id for r in admin.list()} == {"mine", "theirs"}
    assert [r.run_id for r in admin.list(tenant="globex")] == ["theirs"]
    assert acme.counts() == {RunStatus.PENDING: 1}
    assert acme.for_tenant("globex").get(theirs) is not None
    for act in (
        lambda: acme.cancel(theirs),
        lambda: acme.signal(theirs, "go", {}),
        lambda: acme.steer(theirs, "also check the date"),
        lambda: acme.resolve(theirs, done=True),
        lambda: acme.rewind(theirs, to_seq=1),
        lambda: acme.fork(theirs, at_seq=1),
        lambda: acme.wait(theirs, timeout=0.1),
        lambda: acme.events(theirs),
    ):
        with pytest.raises(UnknownRun):
            act()
    assert (acme.history(theirs), acme.calls(theirs), acme.children(theirs)) == ([], [], [])
    assert acme.forks(theirs) == []
    assert admin.get(theirs).status == RunStatus.PENDING  # type: ignore[union-attr]  # untouched
    assert acme.cancel(mine).status == RunStatus.CANCELLED
    with pytest.raises(RunIdConflict):  # its id is taken: never globex's run
        acme.enqueue("probe", {"x": 1}, run_id="theirs")
    # Two tenants' debounce keys of one name are two runs.
    d1 = acme.enqueue("probe", {"x": 1}, debounce_key="k", debounce=30)
    d2 = globex.enqueue("probe", {"x": 2}, debounce_key="k", debounce=30)
    assert d1 != d2 and acme.get(d1) is not None and acme.get(d2) is None
    with pytest.raises(InvalidInput, match="tenant"):
        _client(any_store, "no spaces")


def test_a_tenants_runs_share_its_concurrency_limit_over_its_workflows(
    any_store: CheckpointStore,
) -> None:
    """CAIRN_TENANT_CONCURRENCY: a concurrency key of the tenant's, across its workflows,
    on top of the fleet's; another tenant's runs do not wait for it."""
    settings = Settings.from_env().with_options(tenant_concurrency=1)
    sent: list[str] = []

    def client(tenant: str) -> Client:
        return Client(
            store=any_store, send=lambda r, p: sent.append(r), tenant=tenant, settings=settings
        )

    acme, globex = client("acme"), client("globex")
    a1 = acme.enqueue("probe", {"x": 1})
    a2 = acme.enqueue("other", {"x": 2})  # another workflow: the same tenant's slot
    g1 = globex.enqueue("probe", {"x": 1})
    status = {
        r: acme.for_tenant(t).get(r).status for r, t in ((a1, "acme"), (a2, "acme"), (g1, "globex"))
    }  # type: ignore[union-attr]
    assert status == {a1: RunStatus.PENDING, a2: RunStatus.QUEUED, g1: RunStatus.PENDING}
    assert sent == [a1, g1]
    assert acme.get(a1).concurrency_key == "cairn.tenant:acme"  # type: ignore[union-attr]
    acme.cancel(a1)  # its slot goes to the tenant's next run, which is sent
    assert acme.get(a2).status == RunStatus.PENDING and sent[-1] == a2  # type: ignore[union-attr]
    own = acme.enqueue("probe", {"x": 3}, concurrency_key="user:1")  # a key of its own
    assert acme.get(own).status == RunStatus.PENDING  # type: ignore[union-attr]
    with pytest.raises(InvalidInput, match="cairn's own"):
        acme.enqueue("probe", {"x": 4}, concurrency_key="cairn.tenant:globex")


def test_an_async_client_with_a_tenant_sees_its_runs_only(any_store: CheckpointStore) -> None:
    import asyncio

    from cairn.client import AsyncClient

    async def main() -> None:
        send = lambda run_id, priority: None
        async with (
            AsyncClient(store=any_store, send=send, tenant="acme") as acme,
            AsyncClient(store=any_store, send=send, tenant="globex") as globex,
        ):
            mine = await acme.enqueue("probe", {"x": 1})
            assert (await acme.get(mine)).tenant == "acme"  # type: ignore[union-attr]
            assert await globex.get(mine) is None and await globex.list() == []
            with pytest.raises(UnknownRun):
                await globex.wait(mine, timeout=0.1)
            with pytest.raises(UnknownRun):
                async for _ in globex.events(mine):
                    pass
            assert (await globex.for_tenant("acme").get(mine)) is not None

    asyncio.run(main())
