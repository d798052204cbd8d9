"""Schedules: each tick fires one run, with two firers at once (two processes racing), with
a firer SIGKILLed mid-tick, and after an outage by each catch-up policy; bad input writes
nothing; the CLI and the HTTP API. Two `cairn beat`s: tests/fleet/test_schedules.py."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import Result

from cairn.client.client import Client
from cairn.core.errors import InvalidInput
from cairn.store import Leases, PgStore
from cairn.workers.reaper import Reaper
from cairn.workers.schedules import (
    MAX_CATCH_UP,
    Firer,
    ScheduleConflict,
    UnknownSchedule,
    run_id,
)
from tests.helpers.schedules import SECOND, contiguous, fired
from tests.helpers.services import ROOT


def _firer(client: Client, sent: list[str] | None = None) -> Firer:
    return Firer(
        store=client.store.schedule_store(), send=(sent if sent is not None else []).append
    )


# A firer in its own process: real time for `seconds` (racing another), or one pass at
# `now` that SIGKILLs itself at fault point `die` ("created": runs inserted, not
# committed; "committed": not sent). Prints the run ids it created.
FIRER = """
import datetime as dt, json, os, signal, sys, time
from cairn.store import Database
from cairn.store.schedules import ScheduleStore
from cairn.workers.schedules import Firer

url, seconds, now, die = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]

def hook(point):
    if point == die:
        os.kill(os.getpid(), signal.SIGKILL)

firer = Firer(store=ScheduleStore(Database(url)), send=lambda run_id: None, hook=hook)
created = []
if now:
    created = firer.fire(dt.datetime.fromisoformat(now))
else:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        created += firer.fire()
        time.sleep(0.002)
print(json.dumps(created))
"""


def _spawn(
    settings, tmp_path: Path, seconds: float = 0, now: str = "", die: str = ""
) -> subprocess.Popen[str]:
    script = tmp_path / "firer.py"
    script.write_text(FIRER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(script), settings.database_url, str(seconds), now, die],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_firer_processes_racing_create_each_tick_once_with_no_gap(
    settings, client: Client, sql, tmp_path: Path
) -> None:
    client.add_schedule("race", "loop", {"visits": 1}, every=1)
    procs = [_spawn(settings, tmp_path, seconds=4.0) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    a, b = (json.loads(out) for out, _ in outs)
    assert not set(a) & set(b), "a tick was fired by both"
    ids = fired(sql, "race")
    assert sorted(a + b) == ids and len(ids) >= 3
    assert contiguous(ids), ids


@pytest.mark.parametrize("die", ["created", "committed"])
def test_a_firer_killed_mid_tick_then_restarted_fires_the_tick_once(
    die: str, settings, client: Client, store: PgStore, leases: Leases, sql, tmp_path: Path
) -> None:
    s = client.add_schedule("crash", "loop", {"visits": 1}, every=60)
    tick, now = s.next_at, (s.next_at + SECOND).isoformat()
    killed = _spawn(settings, tmp_path, now=now, die=die)
    killed.communicate(timeout=60)
    assert killed.returncode == -9  # SIGKILLed at the fault point
    expected = [run_id("crash", tick)]
    # Before the commit nothing happened; after it the run exists, unsent.
    assert fired(sql, "crash") == ([] if die == "created" else expected)
    restarted = _spawn(settings, tmp_path, now=now)
    out, err = restarted.communicate(timeout=60)
    assert restarted.returncode == 0, err
    assert json.loads(out) == ([] if die == "committed" else expected)
    assert fired(sql, "crash") == expected
    assert client.schedules()[0].next_at == tick + dt.timedelta(seconds=60)
    if die == "committed":  # created, never sent: the reaper's lost-message pass sends it
        time.sleep(0.3)
        sent: list[str] = []
        Reaper(
            store=store,
            leases=leases,
            settings=dataclasses.replace(settings, lost_after=0.2),
            in_flight=lambda _: 0,
            send=sent.append,
        ).reap()
        assert sent == expected


def test_catch_up_policies_after_an_outage(client: Client, store: PgStore) -> None:
    hourly = {}
    for policy in ("latest", "all", "skip"):
        hourly[policy] = client.add_schedule(
            f"h-{policy}", "loop", {"visits": 1}, every=3600, catch_up=policy
        )
    first = hourly["all"].next_at
    sent: list[str] = []
    # No firer ran for 2.5 hours: ticks first, +1h and +2h were missed.
    created = _firer(client, sent).fire(first + dt.timedelta(hours=2, minutes=30))
    hours = [first + dt.timedelta(hours=h) for h in range(3)]
    assert sorted(created) == sorted(
        [run_id("h-latest", hours[2]), *(run_id("h-all", h) for h in hours)]
    )
    assert sent == created
    for s in client.schedules():  # every policy goes on at the next tick to come
        assert s.next_at == first + dt.timedelta(hours=3), s
    assert {s.name: s.last_fired_at for s in client.schedules()} == {
        "h-all": hours[2],
        "h-latest": hours[2],
        "h-skip": None,
    }
    assert all(store.get(r) is not None for r in created)


def test_all_catches_up_at_most_a_hundred_ticks_a_pass_with_no_gap(client: Client, sql) -> None:
    s = client.add_schedule("backlog", "loop", {"visits": 1}, every=1, catch_up="all")
    later = s.next_at + dt.timedelta(seconds=150)
    firer = _firer(client)
    assert len(firer.fire(later)) == MAX_CATCH_UP
    assert len(firer.fire(later)) == 51 and firer.fire(later) == []
    ids = fired(sql, "backlog")
    assert len(ids) == 151 and contiguous(ids)


def test_a_cron_schedule_and_ticks_on_time_are_fired_whatever_the_policy(client: Client) -> None:
    s = client.add_schedule("tens", "loop", {"visits": 1}, cron="*/10 * * * *", catch_up="skip")
    assert s.next_at.minute % 10 == 0 and s.next_at.second == 0
    firer = _firer(client)
    # 5 s late is on time (a pass behind a busy worker): fired even with "skip".
    assert firer.fire(s.next_at + dt.timedelta(seconds=5)) == [run_id("tens", s.next_at)]
    # Then 35 minutes with no firer: the missed ticks are skipped.
    assert firer.fire(s.next_at + dt.timedelta(minutes=35)) == []
    assert client.schedules()[0].next_at == s.next_at + dt.timedelta(minutes=40)


def test_pause_resume_remove_and_adding_again(client: Client, sql) -> None:
    s = client.add_schedule("p", "loop", {"visits": 1}, every=1)
    assert client.add_schedule("p", "loop", {"visits": 1}, every=1) == s  # a retried add
    with pytest.raises(ScheduleConflict, match="replace=True"):
        client.add_schedule("p", "loop", {"visits": 2}, every=1)
    firer = _firer(client)
    paused = client.pause_schedule("p")
    assert paused.paused and firer.fire(s.next_at + 5 * SECOND) == []
    resumed = client.resume_schedule("p")  # from the next tick after now: none while paused
    assert not resumed.paused and resumed.next_at > dt.datetime.now(dt.UTC)
    assert client.resume_schedule("p") == resumed  # resuming an active one changes nothing
    assert firer.fire(resumed.next_at) == [run_id("p", resumed.next_at)]
    replaced = client.add_schedule("p", "loop", {"visits": 2}, every=1, replace=True)
    assert replaced.input == {"visits": 2} and replaced.next_at == resumed.next_at + SECOND
    assert client.remove_schedule("p") and client.schedules() == []
    assert not client.remove_schedule("p")
    with pytest.raises(UnknownSchedule):
        client.pause_schedule("p")
    with pytest.raises(UnknownSchedule):
        client.resume_schedule("p")
    assert len(fired(sql, "p")) == 1  # its runs stay


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"cron": "61 * * * *"}, "cron '61 * * * *': Bad minute"),
        ({"cron": "0 3 * *"}, "Wrong number of fields"),
        ({"every": 0}, "at least 1 second"),
        ({"every": -5}, "at least 1 second"),
        ({"every": 1.5}, "whole number of seconds"),
        ({"every": 1, "catch_up": "sometimes"}, "catch_up 'sometimes' is not one of"),
        ({"every": 1, "cron": "* * * * *"}, "one of the two"),
        ({}, "one of the two"),
        ({"every": 1, "name": "no spaces"}, "schedule name 'no spaces' is not valid"),
        ({"every": 1, "input": {"x": float("nan")}}, "NaN"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(
    kwargs, says: str, client: Client, sql
) -> None:
    args = {"name": "bad", "workflow": "loop", "input": {}, **kwargs}
    started = time.perf_counter()
    with pytest.raises(InvalidInput) as caught:
        client.add_schedule(args.pop("name"), args.pop("workflow"), args.pop("input"), **args)
    assert time.perf_counter() - started < 0.05
    assert says in str(caught.value)
    assert sql("SELECT count(*) FROM schedules") == [(0,)]


def test_the_async_client_manages_schedules_too(settings) -> None:
    import cairn

    async def main() -> None:
        async with cairn.AsyncClient(settings=settings) as client:
            s = await client.add_schedule("a", "loop", {"visits": 1}, cron="0 3 * * *")
            assert isinstance(s, cairn.Schedule) and s.cron == "0 3 * * *" and s.every is None
            assert (await client.pause_schedule("a")).paused
            assert not (await client.resume_schedule("a")).paused
            assert [x.name for x in await client.schedules()] == ["a"]
            assert await client.remove_schedule("a")
            with pytest.raises(cairn.UnknownSchedule):
                await client.pause_schedule("a")

    asyncio.run(main())


def test_the_cli_adds_lists_pauses_resumes_and_removes(settings) -> None:
    from typer.testing import CliRunner

    from cairn import cli

    env = {"CAIRN_DATABASE_URL": settings.database_url, "CAIRN_WORKFLOWS": "tests.helpers.flows"}

    def cairn(*args: str) -> Result:
        return CliRunner().invoke(cli.app, ["schedules", *args], env=env)

    # Once as a user runs it, a process of its own; then in this one (each start costs).
    added = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "schedules", "add", "nightly", "loop"]
        + ["--cron", "0 3 * * *", "--input", '{"visits": 1}', "--catch-up", "skip", "--json"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["schedule"]["catch_up"] == "skip"
    bad = cairn("add", "often", "loop", "--every", "0")
    assert bad.exit_code == 2 and "every=0: give at least 1 second" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    unknown = cairn("add", "often", "nope", "--every", "1")
    assert unknown.exit_code == 2 and "unknown workflow 'nope'" in unknown.stderr
    pause = cairn("pause", "nightly")
    assert pause.exit_code == 0 and "nightly: paused" in pause.stdout
    listed = json.loads(cairn("list", "--json").stdout)
    assert [(s["name"], s["paused"]) for s in listed["schedules"]] == [("nightly", True)]
    assert "nightly" in cairn("list").stdout
    assert "next run at" in cairn("resume", "nightly").stdout
    assert cairn("remove", "nightly").exit_code == 0
    gone = cairn("remove", "nightly")
    assert gone.exit_code == 2 and "no schedule 'nightly'" in gone.stderr
    for command in ("add", "list", "pause", "resume", "remove"):
        shown = cairn(command, "--help")
        assert shown.exit_code == 0 and "Usage" in shown.stdout


def test_the_http_api(settings) -> None:
    from fastapi.testclient import TestClient

    import tests.helpers.flows  # noqa: F401  (the workflow "loop")
    from cairn.web.api import create_app

    app = create_app(dataclasses.replace(settings, api_token="t0ken"))
    token = {"Authorization": "Bearer t0ken"}
    with TestClient(app) as web:
        assert web.get("/schedules").status_code == 401  # guarded like /runs

        def api(method: str, path: str, body: dict | None = None) -> httpx.Response:
            return web.request(method, path, json=body, headers=token)

        new = {"name": "hourly", "workflow": "loop", "input": {"visits": 1}, "every": 3600}
        created = api("POST", "/schedules", new)
        assert created.status_code == 201, created.text
        assert created.json()["next_at"].endswith("+00:00")
        again = api("POST", "/schedules", {**new, "every": 60})
        assert again.status_code == 409 and again.json()["error"]["type"] == "schedule_conflict"
        bad = api("POST", "/schedules", {**new, "name": "x", "cron": "nope", "every": None})
        assert bad.status_code == 422 and "cron 'nope'" in bad.json()["error"]["message"]
        assert api("POST", "/schedules", {**new, "workflow": "nope"}).status_code == 422
        assert api("POST", "/schedules/hourly/pause").json()["paused"] is True
        assert api("POST", "/schedules/hourly/resume").json()["paused"] is False
        assert [s["name"] for s in api("GET", "/schedules").json()["schedules"]] == ["hourly"]
        assert api("DELETE", "/schedules/hourly").status_code == 204
        assert api("DELETE", "/schedules/hourly").status_code == 404
        missing = api("POST", "/schedules/hourly/pause")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "unknown_schedule"
