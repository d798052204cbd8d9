"""Middleware: code the loop calls around every run and step (dramatiq's middleware).

An ordered list; each hook of each middleware is called in turn, and one that raises is
logged and skipped, never the run's failure: metrics or a tracer must not fail a run.
(Fault injection still kills the process: SIGKILL is no exception.) Metrics are one
middleware (cairn.workers.metrics.Metrics); `cairn chaos` adds one that SIGKILLs the
worker at chosen boundaries (cairn.testing.faults.FaultHooks); tracing will be another.

A delivery of a run:   before_run → [resumed] → per step: before_step → (the step runs)
                       → after_effect → (the save) → after_step … → after_run
Inside a step, per journaled call made (not replayed): before_call → (the call)
                       → after_call → (its journal record)
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint

logger = logging.getLogger(__name__)


class Middleware:
    """Subclass and override what you need; every hook does nothing by default."""

    def before_run(self, run_id: str) -> None:
        """A delivery of the run starts (before its lease is taken)."""

    def resumed(self, cp: Checkpoint) -> None:
        """The run goes on after the worker that had it was lost (cp: where it goes on)."""

    def before_step(self, cp: Checkpoint) -> None:
        """The lease was checked; the step function at cp.cursor is about to run."""

    def after_effect(self, cp: Checkpoint) -> None:
        """The step function returned; its checkpoint is not saved yet."""

    def before_call(self, cp: Checkpoint, name: str, pos: int) -> None:
        """A journaled call (ctx.call, ctx.model) at place pos of the step is about to be
        made: it was checked (lease, cancel, budget) and has no record to replay."""

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, *, exception: BaseException | None
    ) -> None:
        """The call returned (or raised exception); its journal record is not written yet."""

    def budget_crossed(self, cp: Checkpoint, scope: str) -> None:
        """A journaled call's record took the budget scope past its soft limit (once)."""

    def after_step(
        self,
        cp: Checkpoint,
        *,
        saved: Checkpoint | None,
        exception: BaseException | None,
        seconds: float,
    ) -> None:
        """The step attempt that started from cp ended: saved as `saved`, or with
        `exception` (its original cause, if any, is exception.__cause__)."""

    def after_run(
        self, run_id: str, *, status: str | None, exception: BaseException | None
    ) -> None:
        """The delivery ended: with the run's status, or with the exception that ends the
        delivery (a cairn.errors.Interrupted: deferred, retry, hand-off, superseded)."""


class Chain:
    """The ordered middleware, each call guarded. What the loop holds and calls."""

    def __init__(self, middleware: Iterable[Middleware] = ()) -> None:
        self.middleware = tuple(middleware)
        # Only the hooks some middleware overrides are called: an empty chain costs a
        # no-op step nothing, and metrics alone cost one call per step.
        self._calls = {
            name: [getattr(m, name) for m in self.middleware if _overrides(m, name)]
            for name in _HOOKS
        }

    def _emit(self, name: str, *args: object, **kwargs: object) -> None:
        for hook in self._calls[name]:
            try:
                hook(*args, **kwargs)
            except Exception:
                logger.exception(
                    "middleware %s.%s failed (ignored)",
                    type(hook.__self__).__name__,
                    name,
                    extra={"action": "middleware_failed"},
                )

    def before_run(self, run_id: str) -> None:
        self._emit("before_run", run_id)

    def resumed(self, cp: Checkpoint) -> None:
        self._emit("resumed", cp)

    def before_step(self, cp: Checkpoint) -> None:
        self._emit("before_step", cp)

    def after_effect(self, cp: Checkpoint) -> None:
        self._emit("after_effect", cp)

    def before_call(self, cp: Checkpoint, name: str, pos: int) -> None:
        self._emit("before_call", cp, name, pos)

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, exception: BaseException | None = None
    ) -> None:
        self._emit("after_call", cp, name, pos, exception=exception)

    def budget_crossed(self, cp: Checkpoint, scope: str) -> None:
        self._emit("budget_crossed", cp, scope)

    def after_step(
        self,
        cp: Checkpoint,
        started: float,
        saved: Checkpoint | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if self._calls["after_step"]:
            seconds = time.perf_counter() - started
            self._emit("after_step", cp, saved=saved, exception=exception, seconds=seconds)

    def after_run(
        self, run_id: str, status: str | None = None, exception: BaseException | None = None
    ) -> None:
        self._emit("after_run", run_id, status=status, exception=exception)


_HOOKS = (
    "before_run",
    "resumed",
    "before_step",
    "after_effect",
    "before_call",
    "after_call",
    "budget_crossed",
    "after_step",
    "after_run",
)


def _overrides(m: Middleware, name: str) -> bool:
    return getattr(type(m), name) is not getattr(Middleware, name)


NONE = Chain()


def load(paths: Iterable[str]) -> list[Middleware]:
    """Instances of the `module:Class` middleware named in CAIRN_MIDDLEWARE, in order."""
    found = []
    for path in paths:
        module, _, name = path.partition(":")
        try:
            kind = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"CAIRN_MIDDLEWARE names {path!r}, which cannot be imported ({exc}); "
                "write it as module:Class, the module importable by the workers"
            ) from exc
        if not (isinstance(kind, type) and issubclass(kind, Middleware)):
            raise TypeError(
                f"CAIRN_MIDDLEWARE names {path!r}, which is not a cairn Middleware subclass"
            )
        found.append(kind())
    return found
