"""Programs from a seed: operations drawn by weight, each on the objects the program has
made so far (a signal goes to a run that waits for one, a fork to a run that saved a
step), with payloads a user might send (marker strings, unicode, numbers, objects nested
deep, a value shaped like a sealed envelope), as a tenant now and then, through any
surface. A fault that must be in place before its run's first request (a 429 trap, a kill
point) comes right before the enqueue it is for; the others at once or later.

Same seed, same programs: a failure is replayed from its seed (`cairn chaos mix --seed N`)
or from its program.
"""

from __future__ import annotations

import random
from typing import Any

from cairn.testing.mix.flows import FLOWS
from cairn.testing.mix.program import Op, Program

# Operation kinds and their weights; those on a run need one that fits (FITS).
WEIGHTS: dict[str, int] = {
    "enqueue": 18,
    "enqueue_tx": 8,
    "debounce": 2,
    "fork": 6,
    "rewind": 2,
    "replay": 1,
    "signal": 6,
    "steer": 5,
    "cancel": 3,
    "decide": 3,
    "resolve": 1,
    "raise_budget": 1,
    "tenant_budget": 1,
    "schedule_add": 4,
    "schedule": 5,
    "read": 10,
    "settle": 3,
    "model_429_pause": 4,
    "model_fail": 2,
    "model_slow": 1,
    "kill_at": 3,
    "kill_holder": 2,
    "pause_holder": 2,
    "restart": 1,
}
# What a run must be for an operation on it: its workflows (None: any).
FITS: dict[str, tuple[str, ...] | None] = {
    "fork": None,
    "rewind": None,
    "signal": ("mix_wait",),
    "steer": ("mix_steer",),
    "cancel": None,
    "decide": ("mix_approve",),
    "resolve": ("mix_effect",),
    "raise_budget": None,
    "read": None,
    "kill_holder": None,
    "pause_holder": None,
}
# Runs parked most of their life: a kill or a pause of their holder rarely finds one.
PARKED = ("mix_wait", "mix_approve")
VIAS = ("client", "client", "async", "http", "http")
POINTS = ("before_effect", "after_effect", "after_save", "before_call:0", "after_call:0")


class Generator:
    """Programs of `size` (a range of lengths) over `flows`, from rng. A flow that is not
    one of the mix's own (a user's) is enqueued with `template` as its input, each "{i}"
    in its strings a marker."""

    def __init__(
        self,
        rng: random.Random,
        flows: tuple[str, ...] = FLOWS,
        size: tuple[int, int] = (6, 14),
        template: dict[str, Any] | None = None,
    ) -> None:
        self.rng, self.flows, self.size = rng, flows, size
        self.template = template or {}

    def program(self) -> Program:
        self._runs: list[tuple[str, str, str | None]] = []  # name, flow, tenant
        self._schedules: list[str] = []
        self._n = 0
        self._marks = 0
        out: Program = []
        length = self.rng.randint(*self.size)
        while len(out) < length:
            kind = self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
            out += self._make(kind)
        return out

    # -- helpers ---------------------------------------------------------------------------
    def _name(self, kind: str = "r") -> str:
        self._n += 1
        return f"{kind}{self._n}"

    def _mark(self) -> str:
        self._marks += 1
        return f"@mk{self._marks}"

    def _as(self, p: float) -> str | None:
        return self.rng.choice(("t1", "t2")) if self.rng.random() < p else None

    def _via(self) -> str:
        return self.rng.choice(VIAS)

    def _pick(self, kind: str) -> tuple[str, str, str | None] | None:
        fits = FITS.get(kind)
        found = [r for r in self._runs if fits is None or r[1] in fits]
        if kind in ("kill_holder", "pause_holder"):
            found = [r for r in found if r[1] not in PARKED]
        if not found:
            return None
        # The newest most often: what the program is doing now.
        return found[-1] if self.rng.random() < 0.6 else self.rng.choice(found)

    def payload(self) -> Any:
        """A value a user might send, with a marker in it."""
        r, mark = self.rng.random(), self._mark()
        if r < 0.55:
            return mark
        if r < 0.75:
            return {"note": mark, "n": self.rng.randint(-(10**12), 10**12), "tags": [mark, "ü✓ 😀"]}
        if r < 0.85:
            return {"@deep": self.rng.choice((40, 300)), "leaf": mark}
        if r < 0.93:
            return {"doc": {"cairn.sealed": f"v1.mix.{mark}"}, "note": mark}
        return [mark, 1.5, True, None, {"k": mark}]

    def _input(self, flow: str) -> dict[str, Any]:
        if flow not in FLOWS:
            mark = self._mark()
            return dict(_fill(self.template, mark))
        data: dict[str, Any] = {"data": self.payload()}
        if flow == "mix_model":
            data["stream"] = self.rng.random() < 0.3
        elif flow == "mix_effect":
            data["db"] = self.rng.random() < 0.4
        elif flow == "mix_wait":
            data.update(signals=self.rng.randint(1, 2), timeout=3)
        elif flow == "mix_steer":
            data["turns"] = self.rng.randint(3, 6)
        return data

    def _enqueue(self, flow: str | None = None, name: str | None = None) -> Op:
        flow = flow or self.rng.choice(self.flows)
        name = name or self._name()
        tenant = self._as(0.4)
        op: Op = {"op": "enqueue", "run": name, "flow": flow, "input": self._input(flow)}
        op["via"] = self._via()
        if tenant:
            op["as"] = tenant
        if self.rng.random() < 0.15:
            op["priority"] = self.rng.randint(-5, 5)
        if self.rng.random() < 0.1:
            op["key"] = self.rng.choice(("k1", "k2"))
        if self.rng.random() < 0.1 and flow in ("mix_model", "mix_parent"):
            op["budget"] = self.rng.choice((0.000001, 5.0))
        self._runs.append((name, flow, tenant))
        return op

    # -- one operation (or a fault and the enqueue it is for) ----------------------------------
    def _make(self, kind: str) -> Program:
        rng = self.rng
        if kind == "enqueue":
            return [self._enqueue()]
        if kind == "enqueue_tx":
            flow, name, tenant = rng.choice(self.flows), self._name(), self._as(0.3)
            op: Op = {"op": "enqueue_tx", "run": name, "flow": flow, "input": self._input(flow)}
            # Idle: the enqueue is the first statement of the caller's transaction, as in a
            # web handler that enqueues before it writes anything else.
            op.update(end=rng.choice(("commit", "rollback")), idle=rng.random() < 0.6)
            if tenant:
                op["as"] = tenant
            self._runs.append((name, flow, tenant))
            return [op]
        if kind == "debounce":
            flow, name = rng.choice(self.flows), self._name()
            self._runs.append((name, flow, None))
            return [{"op": "debounce", "run": name, "flow": flow, "input": self._input(flow),
                     "key": "d1", "wait": 0.5, "via": self._via()}]  # fmt: skip
        if kind in ("model_429_pause", "kill_at"):
            model = kind == "model_429_pause" and "mix_model" in self.flows
            flow = "mix_model" if model else rng.choice(self.flows)
            enqueue = self._enqueue(flow)
            fault: Op = {"op": kind, "run": enqueue["run"]}
            if kind == "kill_at":
                fault["point"] = rng.choice(POINTS)
            return [fault, enqueue]
        if kind == "model_fail":
            return [
                {"op": kind, "status": rng.choice((429, 500, 503, 529)), "n": rng.randint(1, 3)}
            ]
        if kind == "model_slow":
            return [{"op": kind, "ms": rng.choice((200, 800))}]
        if kind == "restart":
            return [{"op": kind, "what": rng.choice(("serve", "beat"))}]
        if kind == "replay":
            return [{"op": kind, "flow": rng.choice(self.flows)}]
        if kind == "tenant_budget":
            return [{"op": kind, "tenant": rng.choice(("t1", "t2")),
                     "action": rng.choice(("set", "delete")), "usd": rng.choice((0.000001, 5.0))}]  # fmt: skip
        if kind == "schedule_add":
            name, flow = self._name("s"), rng.choice(self.flows)
            self._schedules.append(name)
            add = {"op": kind, "schedule": name, "flow": flow, "input": self._input(flow),
                   "every": 3600}  # fmt: skip
            # Read or changed at once, now and then: by the admin or a tenant.
            return [add, *(self._make("schedule") if rng.random() < 0.5 else [])]
        if kind == "schedule":
            action = rng.choice(("list", "list", "pause", "resume", "remove"))
            op = {"op": kind, "action": action}
            if action != "list":
                if not self._schedules:
                    return []
                op["schedule"] = rng.choice(self._schedules)
            if tenant := self._as(0.5):
                op["as"] = tenant
            return [op]
        if kind == "read" and rng.random() < 0.3:
            op = {"op": kind, "what": rng.choice(("list", "counts")), "via": self._via()}
            if tenant := self._as(0.5):
                op["as"] = tenant
            return [op]
        if kind == "settle":
            target = self._pick("read")
            return [{"op": kind, "run": target[0] if target else None, "timeout": 20}]
        return self._on_run(kind)

    def _on_run(self, kind: str) -> Program:
        rng = self.rng
        target = self._pick(kind)
        if target is None:
            return []
        name, flow, tenant = target
        op: Op = {"op": kind, "run": name}
        # As the run's own tenant, another one, or the admin.
        who = rng.random()
        if who < 0.2:
            op["as"] = "t2" if tenant == "t1" else "t1"
        elif who < 0.5 and tenant:
            op["as"] = tenant
        if kind in ("signal", "steer", "cancel", "fork", "rewind", "read"):
            op["via"] = self._via()
        before: Program = []
        if kind == "fork":
            patch = (
                {"data": self.payload()} if flow in FLOWS else _fill(self.template, self._mark())
            )
            op.update(new=self._name(), at=rng.choice(("first", "last")), patch=patch)
            before = [{"op": "settle", "run": name, "timeout": 20}] if rng.random() < 0.7 else []
            self._runs.append((op["new"], flow, tenant))
        elif kind == "rewind":
            op["to"] = rng.choice(("first", "last"))
            before = [{"op": "settle", "run": name, "timeout": 20}]
        elif kind == "signal":
            op.update(payload=self.payload(), id=self._name("g"))
        elif kind == "steer":
            op["message"] = "stop" if rng.random() < 0.2 else self.payload()
        elif kind == "decide":
            op["decision"] = rng.choice(("approve", "deny", "edit"))
        elif kind == "resolve":
            op["done"] = rng.random() < 0.5
        elif kind == "raise_budget":
            op["usd"] = 5.0
        elif kind == "read":
            op["what"] = rng.choice(
                ("get", "get", "history", "calls", "children", "forks", "events")
            )
        elif kind == "kill_holder":
            op["whole"] = rng.random() < 0.25
        return [*before, op]


def _fill(value: Any, mark: str) -> Any:
    """value with "{i}" in its strings made mark."""
    if isinstance(value, str):
        return value.replace("{i}", mark)
    if isinstance(value, list):
        return [_fill(v, mark) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, mark) for k, v in value.items()}
    return value
