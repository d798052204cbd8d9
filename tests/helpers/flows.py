"""Workflows used by the tests, plugged into workers with CAIRN_WORKFLOWS=tests.helpers.flows,
and cairn's demo workflows (invoice, agent, chat), which the tests run too.

`probe` logs every step attempt to a file and can sleep before or after each step's
effect, so a test can SIGKILL or SIGSTOP a worker at a chosen boundary.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx

import cairn
import cairn.testing.demos.agent  # the demos register wherever the tests' workflows do
import cairn.testing.demos.chat
import cairn.testing.demos.invoice
from cairn.steps import Context, StepResult, workflow
from cairn.steps.model import text_of

probe = workflow("probe")


def _log(ctx: Context, event: str) -> None:
    with open(ctx.input["log"], "a") as f:
        f.write(f"{ctx.cursor} {ctx.visit} {os.getpid()} {event}\n")


def _pause(ctx: Context, where: str) -> None:
    """Sleep at this boundary on the first attempt of this visit only, so the replay
    after a kill runs straight through."""
    seconds = ctx.input.get(where, {}).get(ctx.cursor, 0)
    marker = f"{ctx.input['log']}.slept.{ctx.cursor}.{ctx.visit}.{where}"
    if seconds and not os.path.exists(marker):
        open(marker, "w").close()
        _log(ctx, f"sleep-{where}")
        time.sleep(seconds)


def _around(ctx: Context, effect: Any) -> None:
    _log(ctx, "start")
    _pause(ctx, "before")
    effect()
    _pause(ctx, "after")


@probe.step()
def one(ctx: Context) -> StepResult:
    _around(ctx, lambda: None)
    return StepResult(cursor="two", state={"one": True})


@probe.step()
def two(ctx: Context) -> StepResult:
    box: dict[str, Any] = {}
    question = {"role": "user", "content": f"REPLY: hello {ctx.run_id}"}

    def ask() -> None:
        box["reply"] = ctx.model(messages=[*ctx.window, question], max_tokens=16)

    _around(ctx, ask)
    answer = {"role": "assistant", "content": text_of(box["reply"])}
    return StepResult(cursor="mail", window=[*ctx.window, question, answer])


@probe.step()
def mail(ctx: Context) -> StepResult:
    def send() -> None:
        headers = {} if ctx.input.get("unkeyed") else {"Idempotency-Key": ctx.idempotency_key()}
        httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json={"to": "x@example.com", "subject": "probe", "body": "", "ref": ctx.run_id},
            headers=headers,
            timeout=30,
        ).raise_for_status()

    _around(ctx, send)
    return StepResult(cursor="ledger")


@probe.step()
def ledger(ctx: Context) -> StepResult:
    def write() -> None:
        ctx.db.execute(
            "INSERT INTO invoice_ledger (idempotency_key, run_id, customer, amount_cents)"
            " VALUES (%s, %s, 'probe', 1)",
            (ctx.idempotency_key(), ctx.run_id),
        )

    _around(ctx, write)
    return StepResult(cursor="once")


@probe.step()
def once(ctx: Context) -> StepResult:
    def effect(key: str) -> str:
        with open(ctx.input["log"] + ".effects", "a") as f:
            f.write(f"{key}\n")
        return key

    _around(ctx, lambda: ctx.once(effect))
    return StepResult(cursor="done", state={"finished": True})


# An agent loop: one step revisits itself; every visit sends one keyed email.
loop = workflow("loop")


@loop.step()
def think(ctx: Context) -> StepResult:
    key = ctx.idempotency_key()
    httpx.post(
        f"{ctx.config.mail_url}/v1/send",
        json={"to": "x@example.com", "subject": key, "body": "", "ref": key},
        headers={"Idempotency-Key": key},
        timeout=30,
    ).raise_for_status()
    n = ctx.state.get("n", 0) + 1
    pause = ctx.input.get("sleep_after_visit", {}).get(str(n - 1), 0)
    if pause:
        time.sleep(pause)
    return StepResult(cursor="done" if n >= ctx.input["visits"] else "think", state={"n": n})


# Fails until a file exists: "fix the cause, then enqueue the same run id again".
flaky = workflow("flaky")


@flaky.step()
def attempt(ctx: Context) -> StepResult:
    if not os.path.exists(ctx.input["fixed"]):
        raise RuntimeError("not fixed yet")
    return StepResult(cursor="done")


# An agent loop that never says "done": max_steps stops it.
spin = workflow("spin", max_steps=3)


@spin.step()
def again(ctx: Context) -> StepResult:
    return StepResult(cursor="again")


# Fails with a Transient error the first `fail` times (counted in a file), then finishes.
hiccup = workflow("hiccup")


def _call(ctx: Context) -> StepResult:
    with open(ctx.input["log"], "a") as f:
        f.write(f"call {os.getpid()} {time.time()}\n")
    with open(ctx.input["log"]) as f:
        tries = sum(1 for _ in f)
    if tries <= ctx.input["fail"]:
        raise cairn.Transient(f"the mail API answered 503 (try {tries})")
    return StepResult(cursor="done", state={"tries": tries})


hiccup.step("call", retry=cairn.Retry(attempts=3, backoff=0.2))(_call)
# The same with a backoff longer than the reaper's patience (lease TTL / 2): the reaper
# must leave a run whose retry is scheduled alone.
slow_hiccup = workflow("slow_hiccup")
slow_hiccup.step("call", retry=cairn.Retry(attempts=3, backoff=3.0))(_call)


# A step whose process dies every time (an OOM kill): poison.
oom = workflow("oom")


@oom.step()
def swell(ctx: Context) -> StepResult:
    with open(ctx.input["log"], "a") as f:
        f.write(f"swell {os.getpid()}\n")
    os.kill(os.getpid(), 9)
    return StepResult(cursor="done")


# Version 2 of a workflow whose version 1 kept its counter under "n".
evolving = workflow("evolving", version=2)


@evolving.migration(from_version=1)
def _counter_renamed(state: dict[str, Any]) -> dict[str, Any]:
    state["count"] = state.pop("n")
    return state


@evolving.step()
def tally(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"final": ctx.state["count"] + 1})


# Misbehaving steps, for the error paths.
bad = workflow("bad")


@bad.step()
def boom(ctx: Context) -> StepResult:
    if ctx.input.get("mode") == "raise":
        raise RuntimeError("the step blew up")
    if ctx.input.get("mode") == "two_effects":
        ctx.idempotency_key("a")
        ctx.idempotency_key("b")
    if ctx.input.get("mode") == "huge_window":
        return StepResult(cursor="done", window=[{"role": "user", "content": "x" * 50_000}] * 4)
    return StepResult(cursor="done")


# A charge made at most once: its intent is committed before it runs. "before"/"after"
# pauses (as in probe) sit inside the effect, after the intent; the charge is a mail send
# without an idempotency key, so the mail stand-in counts every one that happens.
at_most = workflow("at_most_once")


@at_most.step()
def charge(ctx: Context) -> StepResult:
    def pay(key: str) -> dict[str, str]:
        _log(ctx, "start")
        _pause(ctx, "before")
        httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json={"to": "x@example.com", "subject": "charge", "body": "", "ref": key},
            timeout=30,
        ).raise_for_status()
        _pause(ctx, "after")
        return {"charged": key}

    result = ctx.once(pay, at_most_once=True)
    return StepResult(cursor="done", state={"charge": result})


# Child runs: `fanout` spawns one `square` per number and sums what its children made; a
# negative number fails its child (the parent sees the error, not a lost result).
fanout = workflow("fanout")
square = workflow("square")
recursive = workflow("recursive")


@fanout.step()
def split(ctx: Context) -> StepResult:
    kids = [cairn.Child("square", {"n": n, **ctx.input.get("child", {})}) for n in ctx.input["ns"]]
    wait = ctx.input.get("wait", "all")
    return StepResult.spawn(kids, cursor="total", wait=wait, state={"spawned": len(kids)})


@fanout.step()
def total(ctx: Context) -> StepResult:
    kids = ctx.children()
    done = [k.state["sq"] for k in kids if k.status == "done" and k.state]
    failed = sorted(k.error for k in kids if k.status == "failed" and k.error)
    statuses = sorted(str(k.status) for k in kids)
    return StepResult(
        cursor="done", state={"total": sum(done), "failed": failed, "statuses": statuses}
    )


@square.step()
def sq(ctx: Context) -> StepResult:
    n = ctx.input["n"]
    if n < 0:
        raise ValueError(f"cannot square {n}: negative")
    time.sleep(ctx.input.get("sleep", 0))
    return StepResult(cursor="done", state={"sq": n * n})


@recursive.step("again")
def spawn_itself(ctx: Context) -> StepResult:
    return StepResult.spawn([cairn.Child("recursive", {})], cursor="back")


@recursive.step()
def back(ctx: Context) -> StepResult:
    return StepResult(cursor="done")


# A durable sleep (StepResult(sleep=...)) between two steps: `after` records when it ran.
sleeper = workflow("sleeper")


@sleeper.step()
def nap(ctx: Context) -> StepResult:
    state, seconds = {"slept_at": time.time()}, ctx.input["seconds"]
    if ctx.input.get("wait"):  # a wait with a timeout: a sleep a signal "wake" ends early
        return StepResult.wait("wake", cursor="after", timeout=seconds, state=state)
    return StepResult(cursor="after", state=state, sleep=seconds)


@sleeper.step()
def after(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"woke_at": time.time(), "signal": ctx.signal})


# Eight journaled calls side by side (ctx.parallel, or asyncio.gather over ctx.acall): the
# slow half sleeps on its first attempt so a test can SIGKILL or SIGSTOP the worker while
# the fast half is journaled; every execution is a `ran` line in the log, and even calls
# send an email keyed per call after their sleep.
fan_sync, fan_async = workflow("fan_sync"), workflow("fan_async")


def _fan_call(ctx: Context, i: int) -> tuple[float, Any]:
    """Call i's sleep (first attempt only) and its work after the sleep."""
    marker = f"{ctx.input['log']}.slept.{i}"
    seconds = ctx.input["pause"] if i >= 4 and not os.path.exists(marker) else 0.0
    if seconds:
        open(marker, "w").close()
        _log(ctx, f"sleep-{i}")

    def work() -> dict[str, Any]:
        _log(ctx, f"ran-{i}")
        if i % 2:  # no check of its own: a zombie's result reaches the journal's fence
            return {"i": i, "pid": os.getpid()}
        key = ctx.idempotency_key()  # checks the lease: a zombie stops here
        httpx.post(
            f"{ctx.config.mail_url}/v1/send",
            json={"to": f"{i}@example.com", "subject": "fan", "body": "", "ref": ctx.run_id},
            headers={"Idempotency-Key": key},
            timeout=30,
        ).raise_for_status()
        return {"i": i, "key": key, "pid": os.getpid()}

    return seconds, work


def _fan_one(ctx: Context, i: int) -> dict[str, Any]:
    seconds, work = _fan_call(ctx, i)
    time.sleep(seconds)
    return work()  # type: ignore[no-any-return]


async def _afan_one(ctx: Context, i: int) -> dict[str, Any]:
    seconds, work = _fan_call(ctx, i)
    await asyncio.sleep(seconds)
    return work()  # type: ignore[no-any-return]


@fan_sync.step()
def fan(ctx: Context) -> StepResult:
    results = ctx.parallel([("fetch", _fan_one, ctx, i) for i in range(8)])
    return StepResult(cursor="done", state={"results": results})


@fan_async.step()
async def afan(ctx: Context) -> StepResult:
    results = await asyncio.gather(*(ctx.acall("fetch", _afan_one, ctx, i) for i in range(8)))
    return StepResult(cursor="done", state={"results": list(results)})


# One step that keeps the input it started with: a debounced run's (tests/fleet/test_debounce.py).
echo = workflow("echo")


@echo.step()
def said(ctx: Context) -> StepResult:
    return StepResult(cursor="done", state={"input": dict(ctx.input)})


# An agent's tool call that needs a person's yes (the approvals inbox): the run parks on
# the request until someone decides it, then the tool runs with the arguments approved.
refund = workflow("refund")


@refund.step()
def propose(ctx: Context) -> StepResult:
    args = {"customer": ctx.input.get("customer", "acme"), "amount": ctx.input.get("amount", 5)}
    request = {"tool": "refund", "args": args, "prompt": f"Refund {args['amount']} EUR?"}
    return StepResult.wait("refund_ok", cursor="pay", request=request)


@refund.step()
def pay(ctx: Context) -> StepResult:
    decided = ctx.signal or {}
    return StepResult(cursor=cairn.DONE, state={"decided": decided})


# Model calls made n times over (input "calls") through one surface ("how"): ctx.model,
# streamed, inside ctx.call, inside ctx.parallel, in the run's second step (a running run,
# which the reaper sends again as soon as its lease is gone). For the tests of the lease
# check before each try (tests/integration/test_fenced_tries.py, tests/fleet/...).
fenced_try = workflow("fenced_try")
ASK = {"messages": [{"role": "user", "content": "REPLY: fenced"}], "max_tokens": 16}


@fenced_try.step("begin")
def fenced_begin(ctx: Context) -> StepResult:
    return StepResult(cursor="ask")


@fenced_try.step("ask")
def fenced_ask(ctx: Context) -> StepResult:
    how, said = ctx.input["how"], []
    for _ in range(ctx.input.get("calls", 1)):
        if how == "create":
            said.append(text_of(ctx.model(**ASK)))
        elif how == "stream":
            said.append(text_of(ctx.model(stream=True, **ASK)))
        elif how == "call":
            said.append(ctx.call("tool", lambda: text_of(ctx.model(**ASK))))
        elif how == "parallel":
            said += ctx.parallel([("tool", lambda: text_of(ctx.model(**ASK)))])
    return StepResult(cursor=cairn.DONE, state={"said": said})
