"""The checks a Client makes before it writes: each operation's arguments, refused with
InvalidInput saying what to change."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from cairn.core.errors import InvalidInput
from cairn.core.inputs import (
    check_debounce,
    check_event,
    check_flow,
    check_input,
    check_run_id,
    check_tenant,
)
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.steps import registry
from cairn.store.schedules import Schedule
from cairn.workers import schedules as sched


def checked(
    settings: Settings, workflow: str, input: dict[str, Any] | None, run_id: str | None
) -> tuple[str, dict[str, Any]]:
    """The run id (a new one if None) and the input, checked before anything is written."""
    data = check_input({} if input is None else input, settings.max_input_bytes)
    run_id = uuid.uuid4().hex if run_id is None else check_run_id(run_id)
    if not isinstance(workflow, str) or not workflow:
        raise InvalidInput("workflow must be a workflow's name")
    flow = registry.find(workflow)
    if flow is not None:
        data = flow.validate(data)
    return run_id, data


def flow(workflow: str, key: Any, limit: Any, priority: Any) -> tuple[str | None, int, int]:
    """Enqueue's flow options checked, the workflow's defaults filling what is None."""
    flow = registry.find(workflow)
    return check_flow(
        key,
        limit if limit is not None else flow.concurrency_limit if flow else 1,
        priority if priority is not None else flow.priority if flow else 0,
    )


def checked_debounce(
    key: Any, debounce: Any, max_wait: Any, run_id: str | None, concurrency_key: str | None
) -> tuple[str, float, float | None] | None:
    """Enqueue's debounce options checked (None: not debounced)."""
    if key is None and debounce is None and max_wait is None:
        return None
    if run_id is not None:
        raise InvalidInput("a debounced enqueue takes no run_id: its debounce_key picks the run")
    if concurrency_key is not None:
        raise InvalidInput("debounce_key and concurrency_key cannot be combined yet")
    return check_debounce(key, debounce, max_wait)


def checked_fork(
    settings: Settings, at: Any, patch: dict[str, Any] | None
) -> tuple[int, dict[str, Any]]:
    if isinstance(at, bool) or not isinstance(at, int) or at < 1:
        raise InvalidInput(f"the seq to fork or rewind at must be a whole number >= 1, not {at!r}")
    patch = {} if patch is None else patch
    return at, check_input(patch, settings.max_input_bytes, what="input patch")


def checked_replay(
    status: RunStatus | str | tuple[RunStatus | str, ...],
    since: dt.datetime,
    until: dt.datetime | None,
    limit: int | None,
) -> tuple[tuple[RunStatus, ...], dt.datetime, dt.datetime | None, int]:
    try:
        statuses = tuple(RunStatus(s) for s in ((status,) if isinstance(status, str) else status))
    except ValueError as exc:
        raise InvalidInput(f"replay: {exc}") from None
    for name, when in (("since", since), ("until", until)):
        if when is not None and (not isinstance(when, dt.datetime) or when.tzinfo is None):
            raise InvalidInput(f"replay: {name} must be a datetime with a time zone, not {when!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInput(f"replay: limit must be a whole number >= 1, not {limit!r}")
    return statuses, since, until, limit if limit is not None else 2**62


def checked_signal(settings: Settings, event: str, payload: Any, signal_id: str | None) -> str:
    check_event(event)
    check_input({"payload": payload}, settings.max_input_bytes, what="payload", envelope=1)
    if signal_id is not None:
        check_run_id(signal_id)  # same rules: it travels as a key and a header too
    return signal_id or uuid.uuid4().hex


def checked_schedule(
    settings: Settings,
    name: str,
    workflow: str,
    input: dict[str, Any] | None,
    cron: str | None,
    every: int | None,
    catch_up: str,
) -> Schedule:
    return sched.checked(
        name,
        workflow,
        input,
        cron=cron,
        every=every,
        catch_up=catch_up,
        max_input_bytes=settings.max_input_bytes,
        now=now(),
    )


def known(name: str, schedule: Schedule | None) -> Schedule:
    if schedule is None:
        raise sched.UnknownSchedule(f"no schedule {name!r}")
    return schedule


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def checked_budget(usd: Any, tokens: Any, soft: Any, elsewhere: bool) -> None:
    """enqueue's budget_usd, budget_tokens and budget_soft (raise_budget's usd and
    tokens); elsewhere: an enqueue in the caller's transaction or debounced, which take
    none yet."""
    if usd is None and tokens is None:
        if soft is not None:
            raise InvalidInput("budget_soft needs budget_usd or budget_tokens: it is a fraction")
        return
    if elsewhere:
        raise InvalidInput("a budget cannot be combined with connection= or a debounce yet")
    if usd is not None and (
        isinstance(usd, bool) or not isinstance(usd, (int, float)) or not 0 < usd < float("inf")
    ):
        raise InvalidInput(f"a budget in dollars is a number above 0, not {usd!r}")
    if tokens is not None and (
        isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1
    ):
        raise InvalidInput(f"a budget in tokens is a whole number above 0, not {tokens!r}")
    checked_soft(soft)


def checked_soft(soft: Any) -> None:
    if soft is not None and (
        isinstance(soft, bool) or not isinstance(soft, (int, float)) or not 0 < soft <= 1
    ):
        raise InvalidInput(
            f"budget_soft is a fraction of the budget, above 0 and at most 1, not {soft!r}"
        )


def checked_tenant_budget(tenant: Any, usd: Any, tokens: Any, per: Any, soft: Any) -> None:
    """set_tenant_budget's arguments: a tenant's name, limits above 0, a UTC day or month,
    a soft fraction (each may be left out: kept as it is)."""
    check_tenant(tenant)
    if per is not None and per not in ("day", "month"):
        raise InvalidInput(f"per={per!r}: a tenant's budget counts per 'day' or 'month' (UTC)")
    checked_budget(usd, tokens, None, False)
    checked_soft(soft)
