"""One program run on the fleet, operation by operation, through the surfaces: what each
operation was told goes into the World (the checks read it), and what no operation may
ever answer (a 5xx, an error the surface does not document, another tenant's data, a
refusal that still changed something) is a violation on the spot.

An operation on a name the program has not created (a shrunk program dropped it) is
skipped, and says so in its outcome."""

from __future__ import annotations

import contextlib
import time
import traceback
from typing import TYPE_CHECKING, Any

from cairn.testing.mix.faults import Faults
from cairn.testing.mix.program import Names, Op, Program
from cairn.testing.mix.surfaces import Refused, ServerError, Surface, Unavailable
from cairn.testing.mix.world import ACCEPTED, REFUSED, ROLLED_BACK, UNKNOWN, RunModel, World

if TYPE_CHECKING:
    from cairn.testing.mix.rig import MixFleet

# Refusals no operation of a well-formed program may get: the store could not open or
# read what it holds.
BROKEN = frozenset({"PayloadKeyError", "CorruptCheckpoint", "internal", "StoreUnavailable"})
QUIET = frozenset({"done", "failed", "cancelled", "budget_exceeded", "incompatible", "unknown"})
# A run parked longer than this (a wait for a signal that may never come) is settled; one
# that wakes sooner (a sleep, a wait's timeout) is waited for.
PARKED_FOR = 30.0


class Skip(Exception):
    """The operation names something the program does not have (yet)."""


class Execution:
    """Run `program` on `fleet` under the names of `prefix`."""

    def __init__(self, fleet: MixFleet, program: Program, prefix: str, say: Any = print) -> None:
        self.fleet, self.program, self.say = fleet, program, say
        self.names = Names(prefix)
        admin = fleet.client()
        self.world = World(names=self.names, started=admin.store.clock())
        self.faults = Faults(fleet, say)
        self._i = 0
        self._faulted: set[str] = set()  # names a fault aimed at before their run existed

    # -- the program ------------------------------------------------------------------------
    def run(self, settle: float = 45.0) -> World:
        """Every operation in turn, then every run left to settle (what a fault stopped
        resumed), for the checks (cleanup() then cancels what still waits)."""
        began = time.monotonic()
        try:
            for i, op in enumerate(self.program):
                self._i = i
                self.world.outcomes.append(self._one(op))
            self.world.seconds["operations"] = time.monotonic() - began
            self.faults.join()
            self.settle(None, settle, final=True)
        finally:
            self.world.faults += len(self.faults.landed)
            self.world.seconds["settle"] = (
                time.monotonic() - began - self.world.seconds.get("operations", 0.0)
            )
        return self.world

    def cleanup(self) -> None:
        """Cancel the program's runs still going, remove its schedules, reset the faults."""
        from cairn.core.errors import CairnError

        admin = self.fleet.client()
        # Best effort: a run or schedule this cannot reach is the next program's no matter.
        for run in self.world.accepted():
            got = read(admin, run.id)
            if got is not None and got.status not in QUIET:
                with contextlib.suppress(CairnError):
                    admin.cancel(run.id)
        for sched in self.world.schedules.values():
            with contextlib.suppress(CairnError):
                admin.remove_schedule(sched["id"])
        self.faults.reset()

    def _one(self, op: Op) -> str:
        kind = op["op"]
        handler = getattr(self, f"_op_{kind}", None)
        if handler is None:
            return f"skipped: unknown operation {kind!r}"
        for name in (op.get("run"),):
            if name is not None and name in self.world.runs:
                self.world.runs[name].ops.append(self._i)
        try:
            result = handler(op)
        except Skip as why:
            return f"skipped: {why}"
        except Refused as refused:
            if refused.kind in BROKEN:
                self._broken(op, f"refused with {refused}")
            return f"refused: {refused.kind}"
        except Unavailable as exc:
            return f"unavailable: {exc}"
        except ServerError as exc:
            self._broken(op, str(exc))
            return "server error"
        except Exception as exc:  # noqa: BLE001 (an error the surface does not document)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            at = f"{'/'.join(where.filename.rsplit('/', 2)[-2:])}:{where.lineno}"
            self._broken(op, f"raised {type(exc).__name__}: {exc} (at {at})")
            return f"error: {type(exc).__name__}"
        return "ok" if result is None else f"ok: {result}"

    def _broken(self, op: Op, what: str) -> None:
        self.world.violate(
            "answers",
            op["op"],
            f"op {self._i} ({op['op']}) {what}",
            *(str(op.get(k)) for k in ("run", "as") if op.get(k)),
        )

    # -- helpers ----------------------------------------------------------------------------
    def _surface(self, op: Op) -> Surface:
        return Surface(self.fleet, op.get("via", "client"), self.names.tenant(op.get("as")))

    def _run(self, op: Op, field: str = "run") -> RunModel:
        model = self.world.runs.get(op.get(field) or "")
        if model is None or model.fate != ACCEPTED:
            raise Skip(f"no run {op.get(field)!r}")
        return model

    def _foreign(self, op: Op, run: RunModel) -> bool:
        """The operation acts as a tenant on a run that is not that tenant's."""
        tenant = self.names.tenant(op.get("as"))
        return tenant is not None and run.tenant != tenant

    def _refused_for_tenant(self, op: Op, run: RunModel, what: str) -> None:
        """A tenant's operation on another's run went through: no tenant may change (or
        see) another's data."""
        self.world.violate(
            "tenancy", op["op"],
            f"op {self._i}: tenant {op.get('as')} {what} run {run.name} "
            f"(of {run.tenant or 'no tenant'}) via {op.get('via', 'client')}",
            run.name, str(op.get("as")),
        )  # fmt: skip

    def _seqs(self, run: RunModel) -> list[int]:
        """The seqs the run saved a checkpoint at (a step that started at seq saved seq+1)."""
        steps = self.fleet.client().history(run.id)
        return sorted(h.seq + 1 for h in steps if h.outcome == "saved")

    def _pick_seq(self, run: RunModel, at: str) -> int:
        seqs = self._seqs(run)
        if not seqs:
            return 1  # nothing saved yet: the surface refuses it
        return seqs[0] if at == "first" else seqs[-1]

    # -- creating runs ------------------------------------------------------------------------
    def _new(self, op: Op, name: str, run_id: str, flow: str, data: Any, origin: str) -> RunModel:
        known = self.world.runs.get(name)
        if known is not None and known.fate == ACCEPTED:
            return known  # the same name again: the same run (or a conflict, refused)
        model = RunModel(
            name=name, id=run_id, flow=flow, tenant=self.names.tenant(op.get("as")),
            input=data, origin=origin, ops=[self._i], faulted=name in self._faulted,
        )  # fmt: skip
        self.world.runs[name] = model
        return model

    def _op_enqueue(self, op: Op) -> str:
        data = self.names.fill(op.get("input") or {})
        run_id = self.names.run(op["run"])
        model = self._new(op, op["run"], run_id, op["flow"], data, "enqueue")
        model.budget = op.get("budget")  # before: an answer that fails may follow the write
        key = op.get("key")
        try:
            got = self._surface(op).enqueue(
                op["flow"], data, run_id, priority=op.get("priority"),
                concurrency_key=self.names.run(key) if key else None,
                budget_usd=op.get("budget"),
            )  # fmt: skip
        except Refused:
            if model.ops == [self._i]:
                model.fate = REFUSED
            raise
        except Unavailable:
            if model.ops == [self._i]:
                model.fate = UNKNOWN
            raise
        return got

    def _op_enqueue_tx(self, op: Op) -> str:
        import psycopg

        data = self.names.fill(op.get("input") or {})
        run_id = self.names.run(op["run"])
        model = self._new(op, op["run"], run_id, op["flow"], data, "enqueue_tx")
        commit = op.get("end", "commit") == "commit"
        with psycopg.connect(self.fleet.db_url) as conn:
            if not op.get("idle", True):
                conn.execute("SELECT 1")  # the caller's transaction is open already
            try:
                self.fleet.client(self.names.tenant(op.get("as"))).enqueue(
                    op["flow"], data, run_id=run_id, connection=conn
                )
            except Exception:
                conn.rollback()
                model.fate = REFUSED
                raise
            if commit:
                conn.commit()
            else:
                conn.rollback()
                model.fate = ROLLED_BACK
        return "committed" if commit else "rolled back"

    def _op_debounce(self, op: Op) -> str:
        data = self.names.fill(op.get("input") or {})
        got = self._surface(op).enqueue(
            op["flow"], data, None, debounce_key=self.names.run(op.get("key", "d")),
            debounce=float(op.get("wait", 0.5)),
        )  # fmt: skip
        same = next((r for r in self.world.runs.values() if r.id == got), None)
        if same is not None:
            same.input = data  # the latest input wins
            self.world.runs[op["run"]] = same
        else:
            self._new(op, op["run"], got, op["flow"], data, "debounce")
        return got

    def _op_fork(self, op: Op) -> str:
        run = self._run(op)
        patch = self.names.fill(op.get("patch") or {})
        new_id = self.names.run(op["new"])
        at = self._pick_seq(run, op.get("at", "first"))
        got = self._surface(op).fork(run.id, at, new_id, patch)
        if self._foreign(op, run):
            self._refused_for_tenant(op, run, "forked")
        merged = {**run.input, **patch} if isinstance(run.input, dict) else patch
        model = RunModel(
            name=op["new"], id=got, flow=run.flow, tenant=run.tenant, input=merged,
            origin="fork", ops=[self._i],
        )  # fmt: skip
        self.world.runs[op["new"]] = model
        return f"at seq {at}"

    def _op_rewind(self, op: Op) -> str:
        run = self._run(op)
        at = self._pick_seq(run, op.get("to", "first"))
        # Before: an answer that fails may follow a rewind made (another tenant's: none).
        run.rewound = run.rewound or not self._foreign(op, run)
        self._surface(op).rewind(run.id, at)
        if self._foreign(op, run):
            self._refused_for_tenant(op, run, "rewound")
        return f"to seq {at}"

    def _op_replay(self, op: Op) -> str:
        admin = self.fleet.client()
        try:
            replayed = admin.replay(op["flow"], since=self.world.started)
        except Exception as exc:
            from cairn.core.errors import CairnError

            if isinstance(exc, CairnError):
                raise Refused(type(exc).__name__, str(exc)) from exc
            raise
        for r in replayed:
            model = self.world.by_id(r.run_id)
            if model is not None:
                model.rewound = True
        return f"{len(replayed)} runs"

    # -- acting on runs ---------------------------------------------------------------------------
    def _op_signal(self, op: Op) -> str:
        run = self._run(op)
        payload = self.names.fill(op.get("payload"))
        stored = self._surface(op).signal(run.id, payload, self.names.run(op.get("id", "g")))
        if self._foreign(op, run):
            self._refused_for_tenant(op, run, "signalled")
        if stored:
            run.signals.append(payload)
        return "stored" if stored else "seen before"

    def _op_steer(self, op: Op) -> str:
        run = self._run(op)
        message = self.names.fill(op.get("message"))
        n = self._surface(op).steer(run.id, message)
        if self._foreign(op, run):
            self._refused_for_tenant(op, run, "steered")
        run.steers.append(message)
        return f"message {n}"

    def _op_cancel(self, op: Op) -> None:
        run = self._run(op)
        # What it may end as, even if the answer fails after it (another tenant's: not).
        run.cancelled = run.cancelled or not self._foreign(op, run)
        self._surface(op).cancel(run.id)
        if self._foreign(op, run):
            self._refused_for_tenant(op, run, "cancelled")

    def _op_decide(self, op: Op) -> str:
        run = self._run(op)
        face = self.fleet.client(self.names.tenant(op.get("as")))
        end = time.monotonic() + 5
        found = None
        while found is None and time.monotonic() < end:
            found = next((a for a in face.approvals(workflow=run.flow) if a.run_id == run.id), None)
            if found is None:
                time.sleep(0.2)
        if found is None:
            if self._foreign(op, run):
                return "not listed (another tenant's)"
            raise Skip("no approval listed for it")
        if self._foreign(op, run):
            self._refused_for_tenant(op, run, "saw the approval of")
        decision = op.get("decision", "approve")
        args = self.names.fill({"data": "@mk-edit"}) if decision == "edit" else None
        try:
            face.decide(found.approval_id, decision, args=args)
        except Exception as exc:
            from cairn.core.errors import CairnError

            if isinstance(exc, CairnError):
                raise Refused(type(exc).__name__, str(exc)) from exc
            raise
        run.decided = decision
        return str(decision)

    def _op_resolve(self, op: Op) -> None:
        run = self._run(op)
        Surface(self.fleet, "client", None)._call("resolve", run.id, done=bool(op.get("done")))

    def _op_raise_budget(self, op: Op) -> None:
        run = self._run(op)
        Surface(self.fleet, "client", None)._call("raise_budget", run.id, usd=op.get("usd", 1.0))

    def _op_tenant_budget(self, op: Op) -> None:
        tenant = self.names.tenant(op.get("tenant", "t0"))
        admin = Surface(self.fleet, "client", None)
        if op.get("action") == "delete":
            admin._call("delete_tenant_budget", tenant)
        else:
            admin._call("set_tenant_budget", tenant, usd=op.get("usd", 1.0))

    # -- schedules -----------------------------------------------------------------------------------
    def _op_schedule_add(self, op: Op) -> None:
        name = self.names.schedule(op["schedule"])
        data = self.names.fill(op.get("input") or {})
        admin = Surface(self.fleet, "client", None)
        admin._call("add_schedule", name, op["flow"], data, every=int(op.get("every", 3600)))
        self.world.schedules[op["schedule"]] = {"id": name, "input": data, "paused": False}

    def _op_schedule(self, op: Op) -> str:
        action = op.get("action", "list")
        tenant = self.names.tenant(op.get("as"))
        face = Surface(self.fleet, "client", tenant)
        if action == "list":
            listed = face._call("schedules")
            ours = {s["id"]: name for name, s in self.world.schedules.items()}
            seen = sorted(ours[s.name] for s in listed if s.name in ours)
            if tenant is not None and seen:
                self.world.violate(
                    "tenancy", "schedule_seen",
                    f"op {self._i}: tenant {op.get('as')} listed the admin's schedules {seen}",
                    str(op.get("as")), *seen,
                )  # fmt: skip
            return f"{len(listed)} listed"
        sched = self.world.schedules.get(op.get("schedule") or "")
        if sched is None or sched.get("removed"):
            raise Skip(f"no schedule {op.get('schedule')!r}")
        method = {"pause": "pause_schedule", "resume": "resume_schedule"}.get(
            action, "remove_schedule"
        )
        face._call(method, sched["id"])
        if tenant is not None:
            self.world.violate(
                "tenancy", "schedule_changed",
                f"op {self._i}: tenant {op.get('as')} could {action} the admin's schedule "
                f"{op['schedule']}",
                str(op.get("as")), str(op["schedule"]),
            )  # fmt: skip
        sched["paused"] = action == "pause" or (sched["paused"] and action != "resume")
        sched["removed"] = action == "remove"
        return str(action)

    # -- reads ---------------------------------------------------------------------------------------
    def _op_read(self, op: Op) -> str:
        what = op.get("what", "get")
        face = self._surface(op)
        tenant = face.tenant
        if what == "list":
            runs = face.list_runs()
            if tenant is not None:
                other = [r["run_id"] for r in runs if r.get("tenant") != tenant]
                if other:
                    self.world.violate(
                        "tenancy", "list",
                        f"op {self._i}: tenant {op.get('as')} listed runs not its own: {other[:5]}",
                        str(op.get("as")),
                    )  # fmt: skip
            return f"{len(runs)} runs"
        if what == "counts":
            return str(sum(face.counts().values()))
        run = self._run(op)
        foreign = self._foreign(op, run)
        if what == "get":
            got = face.get(run.id)
            if foreign and got is not None:
                self._refused_for_tenant(op, run, "read")
            return "found" if got is not None else "none"
        if what == "events":
            try:
                events = face.events(run.id)
            except Refused:
                if foreign:
                    return "refused"
                raise
            if foreign:
                self._refused_for_tenant(op, run, "read the events of")
            return f"{len(events)} events"
        items = face.of_run(what, run.id)
        if foreign and items:
            self._refused_for_tenant(op, run, f"read the {what} of")
        return f"{len(items)} {what}"

    def _op_settle(self, op: Op) -> str:
        name = op.get("run")
        return self.settle(name, float(op.get("timeout", 20.0)))

    def settle(self, name: str | None, timeout: float, *, final: bool = False) -> str:
        """Wait until the run (None: every run of the program) is settled: stopped, or
        waiting, or queued behind its key. At the final settle, a run still pending or
        running is stranded."""
        admin = self.fleet.client()
        runs = [self.world.runs[name]] if name in self.world.runs else self.world.accepted()
        if name is not None and name not in self.world.runs:
            raise Skip(f"no run {name!r}")
        end = time.monotonic() + timeout
        left = list(runs)
        while left and time.monotonic() < end:
            left = [r for r in left if not _settled(read(admin, r.id))]
            if left:
                time.sleep(0.2)
        if final:
            for r in left:
                got = read(admin, r.id)
                status = got.status if got is not None else "missing"
                self.world.violate(
                    "settles", "stranded",
                    f"run {r.name} ({r.flow}) still {status} {timeout:g}s after the program",
                    r.name,
                )  # fmt: skip
        return "settled" if not left else f"{len(left)} not settled"

    # -- faults ----------------------------------------------------------------------------------------
    def _aim(self, op: Op) -> str:
        """The id of the run a fault is for, made or still to come."""
        name = op["run"]
        self._faulted.add(name)
        if name in self.world.runs:
            self.world.runs[name].faulted = True
        return self.names.run(name)

    def _op_model_429_pause(self, op: Op) -> None:
        self.faults.model_429_pause(self._aim(op))

    def _op_model_fail(self, op: Op) -> None:
        self.faults.model_fail(int(op.get("status", 503)), int(op.get("n", 1)))

    def _op_model_slow(self, op: Op) -> None:
        self.faults.model_slow(int(op.get("ms", 300)))

    def _op_kill_at(self, op: Op) -> None:
        self.faults.kill_at(self._aim(op), op.get("point", "after_effect"))

    def _op_kill_holder(self, op: Op) -> None:
        run = self._run(op)
        run.faulted = True
        self.faults.kill_holder(run.id, bool(op.get("whole")))

    def _op_pause_holder(self, op: Op) -> None:
        run = self._run(op)
        run.faulted = True
        self.faults.pause_holder(run.id)

    def _op_restart(self, op: Op) -> None:
        self.faults.restart(op.get("what", "serve"))


def read(client: Any, run_id: str) -> Any:
    """client.get(run_id), None for a run it cannot read (the checks say why)."""
    from cairn.core.errors import CairnError

    try:
        return client.get(run_id)
    except CairnError:
        return None


def _settled(run: Any) -> bool:
    """Stopped, queued behind its key, or parked with no wake-up soon (None: gone)."""
    if run is None or run.status in QUIET or run.status == "queued":
        return True
    if run.status != "waiting":
        return False
    wakes = run.wakes_at
    return wakes is None or wakes.timestamp() > time.time() + PARKED_FOR
