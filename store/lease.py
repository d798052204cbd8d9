"""Per-run Redis leases with a heartbeat and a fencing epoch."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from typing import Any, cast

import redis

from cairn.core import logs
from cairn.core.errors import LeaseLost, StoreUnavailable
from cairn.store import keys, redisconn

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LeaseToken:
    """Who holds a lease: "<host>:<pid>:<nonce>|<epoch>" in Redis (the one place the
    format lives). The nonce tells two leases of one process apart."""

    host: str
    pid: int
    nonce: str
    epoch: int = 0

    @classmethod
    def mine(cls) -> LeaseToken:
        return cls(socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8])

    @classmethod
    def parse(cls, text: str) -> LeaseToken:
        owner, _, epoch = text.partition("|")
        host, _, rest = owner.partition(":")
        pid, _, nonce = rest.partition(":")
        if not pid.isdigit():
            raise ValueError(f"not a lease token: {text!r}")
        return cls(host, int(pid), nonce, int(epoch) if epoch.isdigit() else 0)

    @property
    def owner(self) -> str:
        return f"{self.host}:{self.pid}:{self.nonce}"

    def __str__(self) -> str:
        return f"{self.owner}|{self.epoch}"

    def dead_here(self) -> bool:
        """True when the owner is a process of this host that no longer exists (a
        SIGKILLed pool child): its lease can be broken without waiting out the TTL."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _script(client: redis.Redis, name: str) -> Any:
    return client.register_script(resources.files("cairn.store").joinpath("lua", name).read_text())


@contextlib.contextmanager
def translated() -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailable(f"redis unavailable: {exc}") from exc


class Lease:
    """A held lease. `ensure()` is called before every effect and every save.

    The process's one heartbeat thread (Leases) renews it every ttl/3. `ensure()` trusts
    a renewal younger than half the TTL and otherwise asks Redis itself: a process
    resumed after SIGSTOP finds its last renewal old and learns it lost the run before
    doing anything.
    """

    def __init__(self, leases: Leases, run_id: str, token: LeaseToken, ttl: float) -> None:
        self._leases, self.run_id, self.token, self.ttl = leases, run_id, token, ttl
        self.epoch = token.epoch
        self._renewed_at = time.monotonic()
        self._lost: str | None = None

    def start_heartbeat(self) -> Lease:
        self._leases._beat.track(self)
        return self

    def _renewed(self, held: Any, started: float) -> None:
        """Take a renewal's answer (renew.lua) sent at started."""
        if held != 1:
            self._lost = f"now held by {held.decode() if held else 'nobody (expired)'}"
            raise LeaseLost(self.run_id, self._lost)
        self._renewed_at = started

    def renew(self) -> None:
        if self._lost:
            raise LeaseLost(self.run_id, self._lost)
        started = time.monotonic()
        with translated():
            held = self._leases._renew(
                keys=[keys.lease(self.run_id)], args=[str(self.token), int(self.ttl * 1000)]
            )
        self._renewed(held, started)

    def ensure(self, fresh: bool = False) -> None:
        """Raise LeaseLost unless this worker provably still holds the lease. fresh: ask
        Redis itself whatever the last renewal's age (before an effect nothing else
        fences: ctx.once)."""
        if self._lost:
            raise LeaseLost(self.run_id, self._lost)
        age = time.monotonic() - self._renewed_at
        if age < self.ttl / 2 and not fresh:
            return
        try:
            self.renew()
        except StoreUnavailable:
            if time.monotonic() - self._renewed_at >= self.ttl:
                self._lost = "not renewed within its TTL (redis unreachable)"
                raise LeaseLost(self.run_id, self._lost) from None
            # Still inside the TTL: nobody else can hold it yet.

    def release(self, ended: bool = False) -> None:
        """Let go of the run; ended: it will not run again (or does not exist), so its
        epoch counter goes too, in the same script."""
        self._leases._beat.untrack(self)
        names = [keys.lease(self.run_id), keys.DELIVERIES]
        names += [keys.epoch(self.run_id)] if ended else []
        try:
            with translated():
                self._leases._release(keys=names, args=[str(self.token), self.run_id])
        except StoreUnavailable as exc:
            logger.warning(
                "run %s: lease release failed (it will expire): %s",
                self.run_id,
                exc,
                extra=logs.run(self.run_id, "release_failed", epoch=self.epoch),
            )


class _Heartbeat:
    """One thread per process renews every lease the process holds, each every ttl/3,
    those due together in one pipelined round trip. A threads-pool worker holding 500
    runs has one heartbeat thread, not 500."""

    def __init__(self, leases: Leases) -> None:
        self._leases = leases
        self._held: dict[int, Lease] = {}
        self._wake = threading.Condition()
        self._pid = 0  # the process the thread runs in (a fork does not inherit it)

    def track(self, lease: Lease) -> None:
        with self._wake:
            if self._pid != os.getpid():
                self._pid, self._held = os.getpid(), {}
                threading.Thread(
                    target=self._run, name="cairn-lease-heartbeat", daemon=True
                ).start()
            self._held[id(lease)] = lease
            self._wake.notify()

    def untrack(self, lease: Lease) -> None:
        with self._wake:
            self._held.pop(id(lease), None)

    def _run(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [x for x in self._held.values() if x._renewed_at + x.ttl / 3 <= now]
                if not due:
                    if not self._held:
                        # Idle: wait for a lease, and end after a minute without one (the
                        # next track starts another), so a Leases dropped leaves no thread.
                        self._wake.wait(60.0)
                        if not self._held:
                            self._pid = 0
                            return
                        continue
                    nxt = min(x._renewed_at + x.ttl / 3 for x in self._held.values())
                    self._wake.wait(max(nxt - now, 0.01))
                    continue
            self._renew(due)

    def _renew(self, due: list[Lease]) -> None:
        started = time.monotonic()
        try:
            with translated():
                pipe = self._leases.client.pipeline(transaction=False)
                for x in due:
                    self._leases._renew(
                        keys=[keys.lease(x.run_id)],
                        args=[str(x.token), int(x.ttl * 1000)],
                        client=pipe,
                    )
                answers = pipe.execute(raise_on_error=False)
        except StoreUnavailable as exc:
            # Keep trying; ensure() will refuse once the TTL has passed unrenewed.
            logger.warning(
                "lease renewal failed for %d run(s): %s",
                len(due),
                exc,
                extra=logs.run(None, "renew_failed", runs=[x.run_id for x in due]),
            )
            time.sleep(min(x.ttl for x in due) / 10)
            return
        for x, held in zip(due, answers, strict=True):
            try:
                if isinstance(held, Exception):
                    raise held
                x._renewed(held, started)
            except LeaseLost:
                self.untrack(x)
            except Exception as exc:  # noqa: BLE001 (one lease's error must not stop the rest)
                logger.warning(
                    "run %s: lease renewal failed: %s",
                    x.run_id,
                    exc,
                    extra=logs.run(x.run_id, "renew_failed", epoch=x.epoch),
                )


class Leases:
    """acquire(run_id, owner, ttl) -> Lease | None (None: a live owner holds it)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._acquire = _script(client, "acquire.lua")
        self._renew = _script(client, "renew.lua")
        self._release = _script(client, "release.lua")
        self._offer = _script(client, "offer.lua")
        self._beat = _Heartbeat(self)

    @classmethod
    def from_url(cls, url: str) -> Leases:
        # A blocking pool: a threads worker's hundreds of runs wait a moment for one of
        # 64 connections instead of failing with "Too many connections" (redis-py's
        # default pool raises past 100) and losing leases they still hold.
        return cls(
            redisconn.client(
                url,
                blocking=True,
                max_connections=64,
                timeout=5,
                socket_timeout=5,
                socket_connect_timeout=5,
            )
        )

    def acquire(
        self, run_id: str, ttl: float, floor: int = 0, owner: LeaseToken | None = None
    ) -> Lease | None:
        """The run's lease with an epoch above floor, or None while another owner holds it."""
        owner = owner or LeaseToken.mine()
        with translated():
            epoch, _ = self._acquire(
                keys=[keys.lease(run_id), keys.epoch(run_id), keys.sent(run_id), keys.DELIVERIES],
                args=[owner.owner, int(ttl * 1000), floor, int(keys.EPOCH_TTL * 1000), run_id],
            )
        if not epoch:
            return None
        return Lease(self, run_id, dataclasses.replace(owner, epoch=int(epoch)), ttl)

    def ping(self) -> None:
        with translated():
            self.client.ping()

    def holder(self, run_id: str) -> LeaseToken | None:
        with translated():
            # bytes: the client is made without decode_responses
            value = cast("bytes | None", self.client.get(keys.lease(run_id)))
        return LeaseToken.parse(value.decode()) if value else None

    def holders(self, run_ids: list[str]) -> dict[str, LeaseToken | None]:
        """Each run's lease holder (one MGET per 500 runs)."""
        out: dict[str, LeaseToken | None] = {}
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i : i + 500]
            with translated():
                values = cast(
                    "list[bytes | None]", self.client.mget([keys.lease(r) for r in chunk])
                )
            for r, v in zip(chunk, values, strict=True):
                out[r] = LeaseToken.parse(v.decode()) if v else None
        return out

    def unheld(self, run_ids: list[str]) -> list[str]:
        """The run ids whose lease is gone."""
        return [r for r, token in self.holders(run_ids).items() if token is None]

    def break_dead(self, run_id: str, token: LeaseToken) -> bool:
        """Delete a lease whose owner is known dead, only if it is still that token."""
        with translated():
            # Its delivery stays listed: the one that broke it takes the run and lists it anew.
            return bool(
                self._release(keys=[keys.lease(run_id), keys.DELIVERIES], args=[str(token), ""])
            )

    def lost_deliveries(self, older_than: float, limit: int = 10_000, start: int = 0) -> list[str]:
        """Runs a delivery took over older_than seconds ago (by Redis's clock) and never
        let go of: their worker may have died after the run's last commit, when nothing
        in Postgres says the run needs a worker (keys.DELIVERIES). Their leases tell.
        Oldest first, from the start-th on: the reaper walks them a batch at a time."""
        with translated():
            now_s, now_us = self.client.time()
            before = now_s * 1000 + now_us // 1000 - int(older_than * 1000)
            found = cast(
                "list[bytes]",
                self.client.zrangebyscore(keys.DELIVERIES, "-inf", before, start=start, num=limit),
            )
        return [r.decode() for r in found]

    def offer(self, run_ids: list[str], window: float, cap: float, most: int = 0) -> list[str]:
        """Of run_ids, those with no lease and no message out for them (keys.sent: one
        sent and untaken, within its wait: window, then twice the last wait each send,
        up to cap), each marked sent now, at most `most` (0: all); one round trip
        (store/lua/offer.lua)."""
        if not run_ids:
            return []
        names = [k for r in run_ids for k in (keys.lease(r), keys.sent(r))]
        with translated():
            picked = self._offer(keys=names, args=[int(window * 1000), int(cap * 1000), most])
        return [run_ids[int(i) - 1] for i in picked]

    def unmark(self, run_ids: list[str]) -> None:
        """Forget that these runs were sent: offered, then not sent after all."""
        if run_ids:
            with translated():
                self.client.delete(*[keys.sent(r) for r in run_ids])

    def mark_sent(self, run_id: str, window: float) -> bool:
        """False while an earlier message for the run is out and untaken (keys.sent)."""
        with translated():
            return bool(self.client.set(keys.sent(run_id), 1, nx=True, px=int(window * 1000)))
