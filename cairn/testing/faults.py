"""Fault injection for `cairn chaos`: middleware that SIGKILLs this process at a step boundary.

The loop calls its middleware at three boundaries of every step: "before_effect" (before
the step function runs), "after_effect" (it returned; the checkpoint is not saved yet) and
"after_save" (after_step with the saved checkpoint), and at two around every journaled
call a step makes: "before_call" and "after_call" (it returned; not recorded yet), whose
points are "<boundary>:<pos>". The chaos workers run
`cairn.testing.faulted`'s app, whose middleware is FaultHooks over the JSON plan named by
CAIRN_FAULTS (written by `cairn chaos` before it
starts them). Production workers never load this module. Every hit:

* at "before_effect", journals the attempt and tags this process's outgoing httpx
  requests with ``X-Cairn-Step: <run> <seq> <cursor> <attempt>`` so the chaos mail
  stand-in can attribute every delivery to a step attempt, keyed or not, and with
  ``X-Cairn-Holder: <pid> <epoch>``, the process and the lease epoch it claimed the run
  at, so a stand-in's log tells a request made after the run was claimed above that
  epoch (by a process that no longer held it: `cairn chaos mix`);
* decides from the plan whether this point dies: a point is (run_id, seq, boundary) and
  it dies if it is listed in ``kills`` or if ``hash(seed, run_id, seq, boundary)`` falls
  under ``rate`` (or ``rates[boundary]``), or if a file ``armed/<run>.<point>`` exists
  in the plan's dir (armed while the workers run: the first hit of that point of that
  run dies, at whatever seq, and removes the file). Same seed and run ids, same
  schedule: a failing one can be replayed. A point dies at most once (an O_EXCL marker
  file), so the replay after the kill goes through;
* when it dies, journals the kill first (run, seq, cursor, boundary, pid, wall-clock
  time) and then sends itself SIGKILL: a pool child dies, Celery's parent replaces it and
  the broker redelivers the message (task_reject_on_worker_lost).

The bookkeeping is files in the plan's ``dir`` (the chaos workers all run on this
machine), not Redis: one append-only journal written with single O_APPEND writes, which
survive the SIGKILL that follows, and which a FLUSHDB of the broker's database cannot
erase. Plan keys: dir, seed, rate, rates, kills, spare_pid (a process that must never
kill itself: the chaos driver).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import signal
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from cairn.workers.middleware import Middleware

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint

BOUNDARIES = ("before_effect", "after_effect", "after_save")
# Inside a step, around each journaled call made: before it, and after it returned but
# before its journal record. A point is "<boundary>:<pos>" (the call's place in the step).
CALL_BOUNDARIES = ("before_call", "after_call")
STEP_HEADER = "X-Cairn-Step"
HOLDER_HEADER = "X-Cairn-Holder"
JOURNAL = "journal.jsonl"
ARMED = "armed"  # the plan dir's folder of kill points armed at run time


def armed_path(directory: str, run_id: str, point: str) -> str:
    """The file that arms `point` (a boundary, or "<call boundary>:<pos>") of run_id."""
    return os.path.join(directory, ARMED, f"{quote(run_id, safe='')}.{point}")


def decide(seed: int | str, run_id: str, seq: int, boundary: str, rate: float) -> bool:
    """The seeded rule: does (run_id, seq, boundary) die? Pure, so chaos can predict it."""
    if rate <= 0:
        return False
    digest = hashlib.blake2b(f"{seed}|{run_id}|{seq}|{boundary}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate


class Plan:
    def __init__(self, data: dict[str, Any]) -> None:
        self.dir: str = data["dir"]
        self.seed = data.get("seed", 0)
        rate = float(data.get("rate", 0.0))
        self.rates = {
            b: float(data.get("rates", {}).get(b, rate)) for b in (*BOUNDARIES, *CALL_BOUNDARIES)
        }
        self.kills = {(str(r), int(s), str(b)) for r, s, b in data.get("kills", [])}
        self.spare_pid = data.get("spare_pid")
        self._fd = -1
        self._fd_pid = 0
        self._patched = False
        # The runs this process is in a step of: a threads worker runs several at once, and
        # a kill cuts short a call in flight in each of them, not only in the one that died.
        self._in_step: set[str] = set()
        # "run seq cursor attempt" of the running step, per context, not per thread: a
        # threads worker runs many steps at once, and a step's own threads that copy its
        # context (asyncio.to_thread, LangGraph's executor for a streamed graph) send
        # its requests too.
        self._current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            "cairn_fault_step", default=None
        )
        self._holder: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            "cairn_fault_holder", default=None
        )

    @property
    def current(self) -> str | None:
        return self._current.get()

    @current.setter
    def current(self, value: str | None) -> None:
        self._current.set(value)

    @classmethod
    def load(cls, path: str) -> Plan:
        with open(path) as f:
            return cls(json.load(f))

    def journal(self, record: dict[str, Any]) -> None:
        """One line, one write(2) on an O_APPEND descriptor opened by this process."""
        pid = os.getpid()
        if self._fd_pid != pid:  # a forked pool child opens its own
            self._fd = os.open(
                os.path.join(self.dir, JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
            )
            self._fd_pid = pid
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def due(self, boundary: str, run_id: str, seq: int, point: str | None = None) -> bool:
        point = point or boundary
        return (
            (run_id, seq, point) in self.kills
            or decide(self.seed, run_id, seq, point, self.rates[boundary])
            or os.path.exists(armed_path(self.dir, run_id, point))
        )

    def step_started(self, run_id: str) -> None:
        self._in_step.add(run_id)

    def step_ended(self, run_id: str) -> None:
        self._in_step.discard(run_id)

    def hit(self, boundary: str, run_id: str, seq: int, cursor: str, epoch: int = 0) -> None:
        if boundary == "before_effect":
            self._patch_httpx()
            attempt = time.time_ns()  # attempts of one visit are sequential: time orders them
            self.current = f"{run_id} {seq} {cursor} {attempt}"
            self._holder.set(f"{os.getpid()} {epoch}")
            self.journal(
                {
                    "e": "attempt",
                    "run_id": run_id,
                    "seq": seq,
                    "cursor": cursor,
                    "attempt": attempt,
                    "pid": os.getpid(),
                }
            )
        elif boundary == "after_effect":
            self.current = None
            self._holder.set(None)
        self._maybe_die("boundary", boundary, boundary, run_id, seq, cursor)

    def hit_call(
        self, boundary: str, run_id: str, seq: int, cursor: str, pos: int, raised: str | None = None
    ) -> None:
        """A journaled call's point: before it, or after it ended (not yet recorded). raised:
        the error's type if it ended in one, so a kill there says whether its effect was made
        (a paused zombie's call is refused its key by its lost lease, and sends nothing)."""
        self._maybe_die("call", boundary, f"{boundary}:{pos}", run_id, seq, cursor, raised)

    def _maybe_die(
        self,
        kind: str,
        boundary: str,
        point: str,
        run_id: str,
        seq: int,
        cursor: str,
        raised: str | None = None,
    ) -> None:
        if not self.due(boundary, run_id, seq, point) or os.getpid() == self.spare_pid:
            return
        marker = os.path.join(self.dir, "killed", f"{quote(run_id, safe='')}.{seq}.{point}")
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return  # this point already died once: the replay goes through
        try:  # armed for one kill: the next seq's hit of this point goes through
            os.unlink(armed_path(self.dir, run_id, point))
        except FileNotFoundError:
            pass
        self.journal(
            {
                "e": "kill",
                "kind": kind,
                "boundary": boundary,
                "point": point,
                "run_id": run_id,
                "seq": seq,
                "cursor": cursor,
                "raised": raised,
                "runs": sorted(self._in_step | {run_id}),
                "pid": os.getpid(),
                "ts": time.time(),
            }
        )
        os.kill(os.getpid(), signal.SIGKILL)

    def _patch_httpx(self) -> None:
        """Tag outgoing httpx requests with the step attempt (chaos mode only): those of
        httpx, and those of httpx2, the model SDKs' own copy of it."""
        if self._patched:
            return
        self._patched = True
        import importlib

        for name in ("httpx", "httpx2"):
            try:
                module = importlib.import_module(name)
            except ImportError:  # pragma: no cover
                continue
            self._tag_sends(module)

    def _tag_sends(self, module: Any) -> None:
        original, aoriginal = module.Client.send, module.AsyncClient.send
        plan = self

        def tag(request: Any) -> None:
            if plan.current and STEP_HEADER not in request.headers:
                request.headers[STEP_HEADER] = plan.current
                holder = plan._holder.get()
                if holder:
                    request.headers[HOLDER_HEADER] = holder

        def send(client: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            tag(request)
            return original(client, request, *args, **kwargs)

        async def asend(client: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            tag(request)  # an async step runs in its step's context: plan.current is its own
            return await aoriginal(client, request, *args, **kwargs)

        module.Client.send = send
        module.AsyncClient.send = asend


def read_journal(directory: str) -> list[dict[str, Any]]:
    """The journal's records, in write order (a torn last line is skipped)."""
    path = os.path.join(directory, JOURNAL)
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class FaultHooks(Middleware):
    """The plan's kill points, as the loop's middleware."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    @classmethod
    def from_env(cls) -> FaultHooks:
        return cls(Plan.load(os.environ["CAIRN_FAULTS"]))

    def before_step(self, cp: Checkpoint) -> None:
        self.plan.step_started(cp.run_id)
        self.plan.hit("before_effect", cp.run_id, cp.seq, cp.cursor, cp.epoch)

    def after_effect(self, cp: Checkpoint) -> None:
        self.plan.hit("after_effect", cp.run_id, cp.seq, cp.cursor)

    def before_call(self, cp: Checkpoint, name: str, pos: int) -> None:
        self.plan.hit_call("before_call", cp.run_id, cp.seq, cp.cursor, pos)

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, *, exception: BaseException | None
    ) -> None:
        raised = type(exception).__name__ if exception is not None else None
        self.plan.hit_call("after_call", cp.run_id, cp.seq, cp.cursor, pos, raised)

    def after_step(
        self,
        cp: Checkpoint,
        *,
        saved: Checkpoint | None,
        exception: BaseException | None,
        seconds: float,
    ) -> None:
        self.plan.step_ended(cp.run_id)
        if saved is not None:
            self.plan.hit("after_save", cp.run_id, cp.seq, cp.cursor)
