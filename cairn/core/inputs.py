"""What the door accepts: run ids and inputs, checked before anything is written.

A run id travels in SQL, Redis keys, HTTP headers (the idempotency key) and URLs, so it
is kept to a character set safe in all of them. An input must be a JSON object that
comes back from Postgres as it went in.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from cairn.core.errors import InvalidInput

RUN_ID_MAX = 200
# Enqueue's priority= (and a workflow's): higher starts first. A positive one goes to the
# high queue, ahead of the backlog; the whole number orders a concurrency key's queue.
MIN_PRIORITY, MAX_PRIORITY = -100, 100
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=/-]*")
RUN_ID_RULE = (
    f"1-{RUN_ID_MAX} characters: letters, digits and . _ : @ + = / -, starting with a "
    "letter or digit"
)


def check_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str):
        raise InvalidInput(f"run id must be a string, not {type(run_id).__name__}")
    if not 1 <= len(run_id) <= RUN_ID_MAX or not RUN_ID.fullmatch(run_id):
        shown = run_id if len(run_id) <= 60 else run_id[:57] + "..."
        raise InvalidInput(f"run id {shown!r} is not valid: use {RUN_ID_RULE}")
    return run_id


TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A tenant's concurrency key (CAIRN_TENANT_CONCURRENCY): its slots span the tenant's
# workflows, kept under this name in place of one workflow's.
TENANT_KEY, TENANT_SCOPE = "cairn.tenant:", "cairn.tenant"


def key_scope(workflow: str, key: str | None) -> str:
    """Where a concurrency key's slots are counted: its workflow's, or for a tenant's key
    every workflow's (the SQL's triggers say the same, migration 0021)."""
    return TENANT_SCOPE if key is not None and key.startswith(TENANT_KEY) else workflow


def check_tenant(tenant: Any) -> str:
    """A tenant's name: it travels in URLs, logs and the CLI's columns."""
    if not isinstance(tenant, str) or not TENANT.fullmatch(tenant):
        raise InvalidInput(
            f"tenant {tenant!r} is not valid: use 1-100 letters, digits and . _ -, "
            "starting with a letter or digit"
        )
    return tenant


def check_event(event: Any) -> str:
    """A signal's event name: what a step waits for, and a URL path segment."""
    if not isinstance(event, str) or not 1 <= len(event) <= RUN_ID_MAX or "\x00" in event:
        raise InvalidInput(f"event must be 1-{RUN_ID_MAX} characters without NUL")
    if event.startswith("cairn."):
        raise InvalidInput(f"event {event!r}: names starting with 'cairn.' are cairn's own")
    return event


# How deep a JSON value may nest (objects and lists within one another), and what a
# request body may add around it (its own object). Far below what any reader chokes on:
# pydantic's serializer stops at 255, Python's json at about 1,000 (#52).
MAX_DEPTH = 64
BODY_DEPTH = MAX_DEPTH + 1


def check_input(
    data: Any, max_bytes: int, *, what: str = "input", envelope: int = 0
) -> dict[str, Any]:
    """data if it is a JSON object that round-trips, under max_bytes and MAX_DEPTH (plus
    envelope: levels a caller wrapped around the value it names), with no NUL; else
    InvalidInput. Walked without recursion, so no depth makes it raise anything else."""
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} must be a JSON object, not {type(data).__name__}")
    _walk(data, what, MAX_DEPTH + envelope)
    try:
        text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    except ValueError:
        raise InvalidInput(f"{what} holds NaN or Infinity, which JSON cannot carry") from None
    except TypeError as exc:
        raise InvalidInput(f"{what} is not JSON: {exc}") from None
    size = len(text.encode())
    if size > max_bytes:
        raise InvalidInput(
            f"{what} is {size:,} bytes, over CAIRN_MAX_INPUT_BYTES={max_bytes:,}; "
            "store large data elsewhere and pass a reference"
        )
    if json.loads(text) != data:
        raise InvalidInput(
            f"{what} does not survive a JSON round trip (non-string keys, or tuples?): "
            "use string keys and lists"
        )
    return data


def _walk(data: Any, what: str, most: int) -> None:
    """InvalidInput if data nests deeper than most or holds NUL: one pass, a stack of
    its own (a cycle is refused as too deep, never followed for ever)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise InvalidInput(
                    f"{what} holds a NUL character (\\u0000), which Postgres cannot store"
                )
            continue
        if not isinstance(value, dict | list | tuple):
            continue
        if depth > most:
            raise InvalidInput(
                f"{what} nests deeper than {MAX_DEPTH} levels (objects and lists within "
                "one another): flatten it"
            )
        if isinstance(value, dict):
            stack.extend((k, depth) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        else:
            stack.extend((v, depth + 1) for v in value)


def too_deep(body: bytes, most: int = BODY_DEPTH) -> bool:
    """Whether a JSON text nests deeper than most, told without parsing it (a parser
    recurses, and pydantic's validation after it). Strings go, then every bracket but
    the brackets; each pass takes off every innermost pair: a text still holding some
    after most passes nests deeper. All in C: a megabyte of brackets takes milliseconds."""
    if body.count(b"[") + body.count(b"{") <= most:
        return False  # the common case: two scans
    left = _STRING.sub(b"", body).translate(_TO_SQUARE, _NOT_BRACKET)
    for _ in range(most):
        peeled = left.replace(b"[]", b"")
        if peeled == left:
            return False  # empty, or not JSON: the parser says which
        left = peeled
    return left.replace(b"[]", b"") != left


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # escapes and all
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


LIMIT_MAX = 10_000


def check_flow(
    concurrency_key: Any, concurrency_limit: Any, priority: Any
) -> tuple[str | None, int, int]:
    """Enqueue's flow options: a concurrency key (a run id's characters: it travels in
    URLs and logs too), its limit (runs of the workflow with the key at a time), and a
    priority (higher starts first)."""
    if concurrency_key is not None and not (
        isinstance(concurrency_key, str)
        and 1 <= len(concurrency_key) <= RUN_ID_MAX
        and RUN_ID.fullmatch(concurrency_key)
    ):
        raise InvalidInput(
            f"concurrency key {concurrency_key!r} is not valid: use {RUN_ID_RULE} (e.g. 'user:42')"
        )
    if concurrency_key is not None and concurrency_key.startswith("cairn."):
        raise InvalidInput(
            f"concurrency key {concurrency_key!r}: keys starting with 'cairn.' are cairn's own"
        )
    if not _whole(concurrency_limit) or not 1 <= concurrency_limit <= LIMIT_MAX:
        raise InvalidInput(
            f"concurrency limit must be a whole number from 1 to {LIMIT_MAX:,} (runs with "
            f"one key at a time), not {concurrency_limit!r}"
        )
    if not _whole(priority) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidInput(
            f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY} "
            f"(higher starts first, 0 by default), not {priority!r}"
        )
    return concurrency_key, concurrency_limit, priority


def check_debounce(key: Any, debounce: Any, max_wait: Any) -> tuple[str, float, float | None]:
    """Enqueue's debounce options: a key (a run id's characters), the quiet period in
    seconds (> 0) and the most a stream of enqueues may postpone the start (>= debounce;
    None: no bound)."""
    if key is None:
        raise InvalidInput(
            "debounce needs a debounce_key: the enqueues with one key collapse into one run"
        )
    if not (isinstance(key, str) and 1 <= len(key) <= RUN_ID_MAX and RUN_ID.fullmatch(key)):
        raise InvalidInput(f"debounce key {key!r} is not valid: use {RUN_ID_RULE}")
    if not _seconds(debounce) or debounce <= 0:
        raise InvalidInput(
            f"debounce must be a number of seconds above 0 (the quiet period), not {debounce!r}"
        )
    if max_wait is not None and (not _seconds(max_wait) or max_wait < debounce):
        raise InvalidInput(
            f"max_wait must be a number of seconds at least debounce ({debounce:g}), "
            f"not {max_wait!r}"
        )
    return key, float(debounce), None if max_wait is None else float(max_wait)


def _seconds(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
