"""The invariants, each checked after a program from records the workers do not write
themselves (the stand-ins' request logs, the mail API's deliveries, the database read
straight, Redis read straight, the history trigger) and from what the public surfaces
answer. Each adds Violations to the World:

- readback: every accepted write reads back, the same, through the Client, the
  AsyncClient and HTTP (and its tenant's Client); a rolled-back or refused one is absent;
- sealed: with payload keys on, no marker of the program is in clear in any table of
  Postgres or any key of Redis;
- fenced: no model request and no mail send reached a stand-in from a process after its
  run was claimed above the lease epoch that process held (checkpoint_history);
- history: no run's checkpoint went back (seq, epoch, a done run undone);
- effects: no keyed or at-most-once effect delivered twice (the mail API, per step visit);
- consumed: each signal and steer message consumed once, in the order sent;
- spend: every model answer billed (the stand-in, per idempotency key) is journaled once,
  and the journal's cost is what the bill's usage prices at;
- ends: every run ends in a state the program allows (see allowed());
- reference: a run whose outcome is the program's alone ends as on the in-memory twin
  running the program without its faults (cairn.testing.mix.reference).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from cairn.testing.chaos.history import check_history
from cairn.testing.mix.execute import read
from cairn.testing.mix.flows import FLOWS
from cairn.testing.mix.reference import compare, fleet_end
from cairn.testing.mix.surfaces import Refused, ServerError, Surface, Unavailable
from cairn.testing.mix.world import ACCEPTED, ROLLED_BACK, UNKNOWN, RunModel, World

if TYPE_CHECKING:
    from cairn.testing.mix.program import Program
    from cairn.testing.mix.reference import Twin
    from cairn.testing.mix.rig import MixFleet

# A request may reach a stand-in this long after the claim it raced (the clocks of one
# machine: Postgres's clock_timestamp() and time.time()).
CLOCK_SLACK = 0.05
INVARIANTS = (
    "answers", "tenancy", "readback", "sealed", "fenced", "history", "effects", "consumed",
    "spend", "ends", "reference",
)  # fmt: skip


def check(fleet: MixFleet, world: World, program: Program, twin: Twin | None = None) -> None:
    """Every invariant over what the program left (answers and tenancy are checked as
    each operation is answered, cairn.testing.mix.execute)."""
    ids = [r.id for r in world.runs.values()]
    world.checks += 2  # answers and tenancy, judged as each operation was answered
    for invariant in (readback, sealed, fenced, history, effects, consumed, spend, ends):
        invariant(fleet, world, ids)
        world.checks += 1
    if twin is not None:
        admin = fleet.client()
        ends_here = {}
        for run in world.accepted():
            got = read(admin, run.id)
            if got is not None:
                ends_here[run.name] = fleet_end(got.status, got.state)
        compare(world, program, twin, ends_here)
        world.checks += 1


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def readback(fleet: MixFleet, world: World, ids: list[str]) -> None:
    for run in world.runs.values():
        if run.fate == UNKNOWN:
            continue  # its write did not reach the surface, or its answer did not come back
        faces: list[tuple[str, str | None]] = [("client", None), ("async", None), ("http", None)]
        if run.tenant is not None:
            faces.append(("client", run.tenant))
        for via, tenant in faces:
            who = f"{via}" + (f" as {tenant}" if tenant else "")
            try:
                got = Surface(fleet, via, tenant).get(run.id)
                if via == "http" and got is not None and run.fate == ACCEPTED:
                    for what in ("history", "calls"):
                        Surface(fleet, via, tenant).of_run(what, run.id)
            except Unavailable:
                continue
            except (Refused, ServerError) as exc:
                world.violate(
                    "readback", f"{via}:error",
                    f"run {run.name} ({run.origin}) does not read back through {who}: {exc}",
                    run.name,
                )  # fmt: skip
                continue
            if run.fate == ACCEPTED:
                if got is None:
                    world.violate(
                        "readback", f"{via}:missing",
                        f"run {run.name} ({run.origin}, accepted) is not found through {who}",
                        run.name,
                    )  # fmt: skip
                elif not _same(got.get("input"), run.input):
                    world.violate(
                        "readback", f"{run.origin}:input",
                        f"run {run.name} ({run.origin}) reads back through {who} with input "
                        f"{_short(got.get('input'))}, not {_short(run.input)}",
                        run.name,
                    )  # fmt: skip
            elif got is not None:
                what = "rolled back" if run.fate == ROLLED_BACK else "refused"
                world.violate(
                    "readback", f"{run.origin}:{run.fate}",
                    f"run {run.name} ({run.origin}, {what}) exists: status {got.get('status')}",
                    run.name,
                )  # fmt: skip


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def sealed(fleet: MixFleet, world: World, ids: list[str]) -> None:
    """The program's markers, in clear, anywhere in Postgres or Redis."""
    from cairn.store.admin import RedisDatabase, execute

    mark = world.names.mark
    tables = execute(
        fleet.db_url,
        "SELECT c.relname AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
        " ORDER BY 1",
    )
    for t in tables:
        name = t["name"]
        rows = execute(
            fleet.db_url,
            f'SELECT t::text AS row FROM "{name}" t WHERE t::text LIKE %s LIMIT 3',
            (f"%{mark}%",),
        )
        for row in rows[:1]:
            world.violate(
                "sealed", f"pg:{name}",
                f"table {name} holds a payload in clear: {_around(row['row'], mark)}",
                *_names_in(row["row"], world),
            )  # fmt: skip
    redis = RedisDatabase(fleet.options.redis_url).client
    try:
        seen: set[str] = set()
        needle = mark.encode()
        for key in redis.scan_iter(count=500):
            text = _redis_text(redis, key)
            if needle in text:
                shape = re.sub(rb"[0-9a-f]{8,}|\d+", b"*", key).decode(errors="replace")
                if shape not in seen:
                    seen.add(shape)
                    world.violate(
                        "sealed", f"redis:{shape}",
                        f"Redis key {key.decode(errors='replace')} holds a payload in clear: "
                        f"{_around(text.decode(errors='replace'), mark)}",
                        *_names_in(key.decode(errors="replace"), world),
                    )  # fmt: skip
    finally:
        redis.close()


def _redis_text(redis: Any, key: bytes) -> bytes:
    kind = redis.type(key)
    if kind == b"string":
        return bytes(redis.get(key) or b"")
    if kind == b"hash":
        return repr(redis.hgetall(key)).encode()
    if kind == b"list":
        return repr(redis.lrange(key, 0, -1)).encode()
    if kind == b"set":
        return repr(redis.smembers(key)).encode()
    if kind == b"zset":
        return repr(redis.zrange(key, 0, -1)).encode()
    if kind == b"stream":
        return repr(redis.xrange(key, count=10_000)).encode()
    return b""


def _around(text: str, mark: str) -> str:
    at = text.find(mark)
    return "..." + text[max(0, at - 60) : at + 40] + "..."


def _names_in(text: str, world: World) -> list[str]:
    return [r.name for r in world.runs.values() if r.id in text]


def _history(fleet: MixFleet, ids: list[str]) -> list[dict[str, Any]]:
    from cairn.store.admin import execute

    return execute(
        fleet.db_url,
        "SELECT id, run_id, kind, seq, epoch, cursor, status, extract(epoch FROM at)::float8"
        " AS at FROM checkpoint_history WHERE run_id = ANY(%s) ORDER BY id",
        (ids,),
    )


def fenced(fleet: MixFleet, world: World, ids: list[str]) -> None:
    """A try sent again (the same idempotency key from the same process: a retry, after a
    back-off or an admission wait) after its sender's run was claimed above the epoch it
    held. A first try that crossed a pause is noted, not judged: a process stopped between
    its last lease check and its send sends it on SIGCONT whatever cairn does (the window
    guarantees.md names)."""
    claims: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in _history(fleet, ids):
        claims[row["run_id"]].append((row["epoch"], row["at"]))
    assert fleet.model is not None
    requests = [("model request", r) for r in fleet.model.log()]
    for event in fleet.mail.events():
        step, holder = (event.get("step") or "").split(" "), (event.get("holder") or "").split(" ")
        if len(step) > 1 and len(holder) > 1 and holder[1].isdigit():
            requests.append(("mail send", {"run": step[0], "pid": int(holder[0]), "key": event["key"],
                                           "epoch": int(holder[1]), "at": event["at"]}))  # fmt: skip
    sent: set[tuple[str, Any, Any]] = set()  # (what, pid, key) sent so far
    found: set[str] = set()
    for what, r in requests:
        run_id, epoch, again = r.get("run"), r.get("epoch"), (what, r.get("pid"), r.get("key"))
        retry = r.get("key") is not None and again in sent
        sent.add(again)
        if run_id not in claims or epoch is None or run_id in found:
            continue
        newer = [at for e, at in claims[run_id] if e > epoch and at < r["at"] - CLOCK_SLACK]
        if not newer:
            continue
        model = world.by_id(run_id)
        name = model.name if model else run_id
        late = f"{r['at'] - min(newer):.2f}s after the run was claimed above that epoch"
        if not retry:
            world.notes.append(f"a first {what} for run {name} crossed a pause ({late})")
            continue
        found.add(run_id)
        world.violate(
            "fenced", "model" if what == "model request" else "effect",
            f"a {what} for run {name} was sent again by process {r.get('pid')} at lease epoch "
            f"{epoch}, {late} (by a process that no longer held it)",
            *([model.name] if model else []),
        )  # fmt: skip


def history(fleet: MixFleet, world: World, ids: list[str]) -> None:
    # A rewind or a replay takes a stopped run back in place: a done run goes on again.
    again = {r.id for r in world.runs.values() if r.rewound}
    for problem in check_history(_history(fleet, ids)):
        names = _names_in(problem, world)
        run_id = problem.split(":", 1)[0].removeprefix("run ")
        if run_id in again and "a done run became" in problem:
            continue
        kind = problem.split(": ", 1)[-1].split(" ")[:3]
        world.violate("history", "_".join(kind), problem, *names)


def effects(fleet: MixFleet, world: World, ids: list[str]) -> None:
    counts = Counter(
        m["ref"]
        for m in fleet.mail.messages()
        if isinstance(m.get("ref"), str) and m["ref"].endswith((":keyed", ":at_most_once"))
    )
    for ref, n in counts.items():
        run_id = ref.split(":", 1)[0]
        model = world.by_id(run_id)
        if model is not None and n > 1:
            world.violate(
                "effects", ref.rsplit(":", 1)[1],
                f"effect {ref} of run {model.name} delivered {n} times", model.name,
            )  # fmt: skip


def consumed(fleet: MixFleet, world: World, ids: list[str]) -> None:
    admin = fleet.client()
    for run in world.accepted():
        if run.flow not in ("mix_wait", "mix_steer") or run.rewound or run.origin == "fork":
            continue
        got_run = read(admin, run.id)
        if got_run is None or got_run.state is None:
            continue
        got = [g for g in got_run.state.get("got", []) if g != "timeout"]
        sent = run.signals if run.flow == "mix_wait" else run.steers
        what = "signals" if run.flow == "mix_wait" else "steer messages"
        if not _same(got, sent[: len(got)]):
            world.violate(
                "consumed", what,
                f"run {run.name} consumed {what} {_short(got)}; sent, in order: {_short(sent)}",
                run.name,
            )  # fmt: skip


def spend(fleet: MixFleet, world: World, ids: list[str]) -> None:
    from cairn.steps.prices import cost_of
    from cairn.store.admin import execute

    assert fleet.model is not None
    billed: dict[str, list[Any]] = defaultdict(list)
    for key, (model, usage) in fleet.model.billed_keys().items():
        if key.startswith("cairn:"):
            billed[key.split(":")[1]].append((model, usage))
    rows = execute(
        fleet.db_url,
        "SELECT run_id, count(*) AS n, coalesce(sum(cost_usd), 0) AS usd FROM journal"
        " WHERE run_id = ANY(%s) AND name = 'model' AND error IS NULL GROUP BY run_id",
        (ids,),
    )
    journaled = {r["run_id"]: (int(r["n"]), float(r["usd"])) for r in rows}
    admin = fleet.client()
    for run in world.accepted():
        got = read(admin, run.id)
        if got is None or got.status != "done":
            continue  # a call in flight when it stopped was billed, and is not recorded
        n, usd = journaled.get(run.id, (0, 0.0))
        bills = billed.get(run.id, [])
        price = sum(cost_of(m, u, "anthropic") for m, u in bills)
        if n != len(bills) or abs(price - usd) > 1e-9:
            world.violate(
                "spend", "recorded_vs_billed",
                f"run {run.name}: {n} model answers journaled costing ${usd:.6f}; "
                f"{len(bills)} billed, pricing at ${price:.6f}",
                run.name,
            )  # fmt: skip


def allowed(run: RunModel) -> set[str]:
    """The statuses a run may end in, given what the program did to it."""
    ok = {"done"}
    if run.flow not in FLOWS:
        ok.add("waiting")  # a user's workflow: it may wait for what the mix never sends
    if run.flow == "mix_approve" and run.decided is None:
        ok.add("waiting")
    if run.cancelled:
        ok.add("cancelled")
    if run.budget is not None:
        ok.add("budget_exceeded")
    if run.faulted and run.flow in ("mix_effect", "mix_parent"):
        ok.add("unknown")  # an at-most-once effect's intent without its mark
    return ok


def ends(fleet: MixFleet, world: World, ids: list[str]) -> None:
    admin = fleet.client()
    for run in world.accepted():
        got = read(admin, run.id)
        if got is None:
            continue  # readback names it
        if str(got.status) not in allowed(run) and not _queued_behind(run, got, world):
            world.violate(
                "ends", f"{run.flow}:{got.status}",
                f"run {run.name} ({run.flow}, {run.origin}) ended {got.status}"
                + (f": {got.error[:200]}" if got.error else "")
                + f"; the program allows {sorted(allowed(run))}",
                run.name,
            )  # fmt: skip


def _queued_behind(run: RunModel, got: Any, world: World) -> bool:
    """Queued behind its concurrency key, or parked with the program's other runs."""
    return str(got.status) in ("queued", "waiting") and (
        got.concurrency_key is not None or any(r.flow == "mix_approve" for r in world.runs.values())
    )
