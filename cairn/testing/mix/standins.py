"""The mix's stand-ins: the model API and the mail API of cairn.testing.standins, each
with a log of every request a faulted worker made (its run, its process and the lease
epoch it claimed the run at, from the X-Cairn-Step and X-Cairn-Holder headers of
cairn/testing/faults.py, and when it arrived), and a model that answers a run's next
requests with an error on cue, telling the mix whose request it was (so the mix can stop
that process inside the back-off the error starts)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from cairn.testing.chaos.rig import chaos_mail
from cairn.testing.faults import HOLDER_HEADER, STEP_HEADER
from cairn.testing.standins import ModelServer
from cairn.testing.standins.model import _FAIL_MESSAGES, _ROUTES


def sender(headers: dict[str, str]) -> dict[str, Any]:
    """Who sent a request, from a faulted worker's headers: run, seq, pid, epoch (None
    for each a request without them lacks)."""
    lower = {k.lower(): v for k, v in headers.items()}
    step = (lower.get(STEP_HEADER.lower()) or "").split(" ")
    holder = (lower.get(HOLDER_HEADER.lower()) or "").split(" ")
    return {
        "run": step[0] or None,
        "seq": int(step[1]) if len(step) > 1 and step[1].isdigit() else None,
        "pid": int(holder[0]) if holder[0].isdigit() else None,
        "epoch": int(holder[1]) if len(holder) > 1 and holder[1].isdigit() else None,
        "key": lower.get("idempotency-key"),
    }


@dataclasses.dataclass
class Trap:
    """The next `left` model requests (of run, or of any run with None) are answered
    `status` with a retry-after of `retry_after` seconds; `then(request)` is told of each
    (its log record) after the answer is decided."""

    run: str | None
    status: int
    retry_after: float
    left: int = 1
    then: Callable[[dict[str, Any]], None] | None = None


class MixModel(ModelServer):
    """ModelServer with a request log (`log()`) and traps (`trap()`)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._log: list[dict[str, Any]] = []
        self._traps: list[Trap] = []
        self._log_lock = threading.Lock()

    def trap(self, trap: Trap) -> None:
        with self._log_lock:
            self._traps.append(trap)

    def clear_traps(self) -> None:
        with self._log_lock:
            self._traps.clear()

    def log(self) -> list[dict[str, Any]]:
        with self._log_lock:
            return [dict(r) for r in self._log]

    def billed_keys(self) -> dict[str, tuple[Any, Any]]:
        """(model, usage) per Idempotency-Key billed (or "request N" without one)."""
        with self._lock:
            return dict(self._billed)

    def _handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        api = _ROUTES.get(path)
        if method != "POST" or api is None:
            return super()._handle(method, path, headers, raw)
        record = {"at": time.time(), "path": path, **sender(headers)}
        with self._log_lock:
            self._log.append(record)
            trap = next(
                (t for t in self._traps if t.left > 0 and t.run in (None, record["run"])), None
            )
            if trap is not None:
                trap.left -= 1
                if trap.left <= 0:
                    self._traps.remove(trap)
        if trap is None:
            status, body, extra = super()._handle(method, path, headers, raw)
            record["status"] = status
            return status, body, extra
        record["status"] = trap.status
        if trap.then is not None:
            trap.then(record)
        error = api.error(trap.status, _FAIL_MESSAGES[trap.status])
        return trap.status, error, {"retry-after": f"{trap.retry_after:g}"}


def mix_mail(**options: Any) -> Any:
    """The chaos mail stand-in (each delivery with its sender's headers and arrival)."""
    return chaos_mail(**options)
