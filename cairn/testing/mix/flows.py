"""The mix's workflows: a small set that between them make every kind of call a step can
make, each quick (seconds), each keeping in its state what it received, so the mix can
check from outside what was consumed.

Every input may carry any JSON under "data" (the mix puts its marker strings there, and
values a user might send: deep, wide, unicode, shaped like a sealed envelope); the flows
copy it into their state, so it is stored in the input, the state, the journal, the
window and the events.

- mix_model: a model call (streamed with "stream": true), a journaled tool call and two
  parallel ones.
- mix_effect: a send to the mail API under the step's idempotency key, one through
  ctx.once (at least once: no key downstream) and one through ctx.once(at_most_once=True)
  (a crash between its intent and its mark stops the run as unknown); with "db": true a
  row in the mix's own table through ctx.db, in the checkpoint's transaction.
- mix_wait: waits for "signals" signals of the event "go" in turn, each with a timeout
  ("timeout" seconds), a short sleep between; keeps each payload, or "timeout".
- mix_steer: turns 0.3 s apart reading ctx.messages() until "stop" or "turns" turns.
- mix_parent: spawns two children (mix_model, mix_effect) and waits for both.
- mix_approve: waits for an approval of a "refund" tool call; keeps the decision.

The mail's "ref" names the effect's step visit, `<run>:<cursor>:<visit>:<name>`: a keyed
or at-most-once effect delivered twice for one ref is a duplicate.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from cairn.core.errors import Transient
from cairn.steps.context import Context
from cairn.steps.model import text_of
from cairn.steps.registry import DONE, Child, StepResult, workflow

FLOWS = ("mix_model", "mix_effect", "mix_wait", "mix_steer", "mix_parent", "mix_approve")
LEDGER = "mix_ledger"  # the table ctx.db writes (the mix's database has it)
LEDGER_SQL = f"""CREATE TABLE IF NOT EXISTS {LEDGER} (
    key text PRIMARY KEY, run_id text NOT NULL, data jsonb)"""


def _data(ctx: Context) -> Any:
    return ctx.input.get("data")


def _lookup(what: str) -> dict[str, Any]:
    return {"looked_up": what}


# -- mix_model --------------------------------------------------------------------------
model_flow = workflow("mix_model")


@model_flow.step()
def ask(ctx: Context) -> StepResult:
    # The stand-in answers the REPLY line: the answer, the journal and the window carry
    # the run's data too (sealed like the input).
    prompt = "REPLY: noted " + json.dumps(_data(ctx))[:160]
    reply = ctx.model(
        messages=[{"role": "user", "content": prompt}],
        max_tokens=64,
        stream=bool(ctx.input.get("stream")),
    )
    answer = text_of(reply)
    window = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    return StepResult(cursor="tools", state={"answer": answer, "data": _data(ctx)}, window=window)


@model_flow.step()
def tools(ctx: Context) -> StepResult:
    one = ctx.call("lookup", _lookup, ctx.run_id)
    both = ctx.parallel([("left", _lookup, "left"), ("right", _lookup, "right")])
    return StepResult(cursor=DONE, state={"tools": [one, *both]})


# -- mix_effect -------------------------------------------------------------------------
effect_flow = workflow("mix_effect")


def _mail(ctx: Context, name: str, key: str | None) -> str:
    body = {
        "to": f"{ctx.run_id}@mix.test",
        "subject": name,
        "body": json.dumps(_data(ctx))[:200],
        "ref": f"{ctx.run_id}:{ctx.cursor}:{ctx.visit}:{name}",
    }
    url = ctx.config.mail_url or os.environ.get("CAIRN_MAIL_URL", "")
    try:
        resp = httpx.post(
            f"{url}/v1/send", json=body, headers={"Idempotency-Key": key} if key else {}, timeout=30
        )
    except httpx.TransportError as exc:
        raise Transient(f"mail API unreachable: {exc}") from exc
    if resp.status_code >= 500:
        raise Transient(f"mail API answered {resp.status_code}")
    resp.raise_for_status()
    return str(resp.json()["id"])


@effect_flow.step()
def send(ctx: Context) -> StepResult:
    sent = _mail(ctx, "keyed", ctx.idempotency_key())
    return StepResult(cursor="once", state={"keyed": sent, "data": _data(ctx)})


@effect_flow.step()
def once(ctx: Context) -> StepResult:
    sent = ctx.once(lambda key: _mail(ctx, "once", None))
    return StepResult(cursor="at_most", state={"once": sent})


@effect_flow.step()
def at_most(ctx: Context) -> StepResult:
    sent = ctx.once(lambda key: _mail(ctx, "at_most_once", None), at_most_once=True)
    return StepResult(cursor="record" if ctx.input.get("db") else DONE, state={"at_most": sent})


@effect_flow.step()
def record(ctx: Context) -> StepResult:
    ctx.db.execute(
        f"INSERT INTO {LEDGER} (key, run_id, data) VALUES (%s, %s, %s::jsonb)"
        " ON CONFLICT (key) DO NOTHING",
        (ctx.idempotency_key(), ctx.run_id, json.dumps({"n": len(json.dumps(_data(ctx)))})),
    )
    return StepResult(cursor=DONE, state={"recorded": True})


# -- mix_wait ---------------------------------------------------------------------------
wait_flow = workflow("mix_wait")


@wait_flow.step()
def listen(ctx: Context) -> StepResult:
    got = list(ctx.state.get("got", []))
    if len(got) >= int(ctx.input.get("signals", 1)):
        return StepResult(cursor=DONE, state={"data": _data(ctx)})
    timeout = float(ctx.input.get("timeout", 6))
    return StepResult.wait("go", cursor="heard", timeout=timeout, on_timeout="timed_out")


@wait_flow.step()
def heard(ctx: Context) -> StepResult:
    got = [*ctx.state.get("got", []), ctx.signal]
    return StepResult(cursor="listen", state={"got": got}, sleep=0.2)


@wait_flow.step()
def timed_out(ctx: Context) -> StepResult:
    return StepResult(cursor="listen", state={"got": [*ctx.state.get("got", []), "timeout"]})


# -- mix_steer --------------------------------------------------------------------------
steer_flow = workflow("mix_steer")


@steer_flow.step()
def turn(ctx: Context) -> StepResult:
    got = [*ctx.state.get("got", []), *ctx.messages()]
    turns = int(ctx.state.get("turns", 0)) + 1
    if "stop" in got or turns >= int(ctx.input.get("turns", 8)):
        return StepResult(cursor=DONE, state={"got": got, "turns": turns})
    return StepResult(cursor="turn", state={"got": got, "turns": turns}, sleep=0.3)


# -- mix_parent -------------------------------------------------------------------------
parent_flow = workflow("mix_parent")


@parent_flow.step()
def fan_out(ctx: Context) -> StepResult:
    data = _data(ctx)
    kids = [
        Child("mix_model", {"data": data}, key="m"),
        Child("mix_effect", {"data": data}, key="e"),
    ]
    return StepResult.spawn(kids, cursor="gather", timeout=20)


@parent_flow.step()
def gather(ctx: Context) -> StepResult:
    return StepResult(
        cursor=DONE, state={"children": sorted(str(c.status) for c in ctx.children())}
    )


# -- mix_approve ------------------------------------------------------------------------
approve_flow = workflow("mix_approve")


@approve_flow.step()
def request(ctx: Context) -> StepResult:
    ask = {"tool": "refund", "args": {"data": _data(ctx)}, "prompt": "refund?"}
    return StepResult.wait("refund", cursor="decided", timeout=3600, request=ask)


@approve_flow.step()
def decided(ctx: Context) -> StepResult:
    signal = ctx.signal if isinstance(ctx.signal, dict) else {}
    return StepResult(
        cursor=DONE, state={"decision": signal.get("decision"), "args": signal.get("args")}
    )
