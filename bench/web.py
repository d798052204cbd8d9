"""`python -m bench.web`: what `cairn serve` costs over the Client it wraps.

- POST /runs from N concurrent HTTP clients against the same N threads calling
  Client.enqueue in-process (the least work a start needs: one insert and one message),
  interleaved in one run: runs/s, p50/p95 latency and the ratio.
- The run page of a run with 500 steps: server time of the page and of its live part,
  and the load time in headless Chromium (navigation start to the load event).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psycopg

from bench.common import ROOT, Databases, bench_redis, median, pct, progress
from bench.internals import admin, fleet, upgrade
from cairn import Client, Settings


def _hammer(clients: int, seconds: float, call: Callable[[int], None]) -> dict[str, float]:
    """clients threads calling call(i) for seconds; throughput and latency."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.monotonic() + seconds

    def loop(slot: int) -> None:
        i = 0
        while time.monotonic() < stop:
            started = time.perf_counter()
            call(slot * 1_000_000 + i)
            latencies[slot].append(time.perf_counter() - started)
            i += 1

    threads = [threading.Thread(target=loop, args=(n,)) for n in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - began
    flat = [x for xs in latencies for x in xs]
    return {
        "per_s": len(flat) / took,
        "p50_ms": 1000 * median(flat),
        "p95_ms": 1000 * pct(flat, 95),
        "n": len(flat),
    }


def _page_load(url: str, token: str) -> float | str:
    """Milliseconds from navigation start to the load event, in headless Chromium."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        return "no chromium"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"):  # fmt: skip
        options.add_argument(arg)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        login = url.split("/ui/")[0] + "/login"
        chrome.get(login)
        chrome.find_element("id", "token").send_keys(token)
        chrome.find_element("css selector", "form.login button").click()
        times = []
        for _ in range(5):
            chrome.get(url)
            times.append(
                chrome.execute_script(
                    "const t = performance.getEntriesByType('navigation')[0];"
                    "return t.loadEventEnd - t.startTime;"
                )
            )
        return median(times)
    finally:
        chrome.quit()


def _history(db_url: str, run_id: str, steps: int) -> None:
    """A finished run of `steps` steps on two workers with one resume, written directly:
    the page reads only the run and its history."""
    start = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=steps)
    rows = []
    for i in range(steps):
        worker, epoch = ("vm:101:aaaa", 1) if i < steps // 2 else ("vm:202:bbbb", 2)
        began = start + dt.timedelta(seconds=i + (3 if epoch == 2 else 0))
        rows.append((run_id, i, "think", i, "saved", began, began + dt.timedelta(seconds=0.4),
                     worker, epoch, 0.0002, f"cairn:{run_id}:think:{i}", run_id))  # fmt: skip
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.cursor().executemany(
            "INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, "
            "ended_at, worker, epoch, cost_usd, effect_key, run_created) "
            "SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, created_at"
            " FROM checkpoints WHERE run_id = %s",
            rows,
        )
        conn.execute(
            "UPDATE checkpoints SET status = 'done', cursor = 'done', seq = %s, resumes = 1, "
            "cost_usd = %s WHERE run_id = %s",
            (steps, 0.0002 * steps, run_id),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web", description=__doc__)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args(argv)

    dbs = Databases()
    db_url = dbs.fresh("web")
    upgrade(db_url)
    redis_url = bench_redis()
    admin.RedisDatabase(redis_url).flush()
    settings = Settings.from_env().with_options(database_url=db_url, redis_url=redis_url)
    token = uuid.uuid4().hex
    port = fleet.free_port()
    env = fleet.child_env(
        CAIRN_DATABASE_URL=db_url,
        CAIRN_REDIS_URL=redis_url,
        CAIRN_API_TOKEN=token,
        CAIRN_WORKFLOWS="cairn.testing.demos.invoice",  # the server checks the name POSTed
    )
    log = ROOT / ".cairn" / "bench-web-serve.log"
    server = fleet.start_server(env, log, port)
    body: dict[str, Any] = {"workflow": "invoice", "input": {"customer": "acme", "email": "a@b.c"}}
    try:
        with Client(settings=settings) as client:
            client.enqueue("invoice", body["input"])  # Celery's producer warmed up

            def direct(i: int) -> None:
                client.enqueue("invoice", body["input"], run_id=f"d-{i}-{uuid.uuid4().hex[:6]}")

            https = [
                httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=30,
                )
                for _ in range(args.clients)
            ]

            def http(i: int) -> None:
                response = https[i // 1_000_000].post(
                    "/runs", json={**body, "run_id": f"h-{i}-{uuid.uuid4().hex[:6]}"}
                )
                response.raise_for_status()

            results: dict[str, list[dict[str, float]]] = {"direct": [], "http": []}
            for round_ in range(2):  # interleaved: both see the same machine state
                progress(f"round {round_ + 1}: Client.enqueue x{args.clients} threads")
                results["direct"].append(_hammer(args.clients, args.seconds / 2, direct))
                progress(f"round {round_ + 1}: POST /runs x{args.clients} HTTP clients")
                results["http"].append(_hammer(args.clients, args.seconds / 2, http))
            for h in https:
                h.close()

            run_id = f"long-{uuid.uuid4().hex[:6]}"
            client.store.create_run(run_id, "loop", {})
            _history(db_url, run_id, args.steps)
        page = f"http://127.0.0.1:{port}/ui/runs/{run_id}"
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as get:
            server_ms = []
            partial_ms = []
            for _ in range(10):
                started = time.perf_counter()
                get.get(page).raise_for_status()
                server_ms.append(1000 * (time.perf_counter() - started))
                started = time.perf_counter()
                get.get(page, params={"partial": 1}).raise_for_status()
                partial_ms.append(1000 * (time.perf_counter() - started))
            size = len(get.get(page).content)
        load_ms = _page_load(page, token)
    finally:
        server.kill()
        dbs.close()

    def best(rows: list[dict[str, float]]) -> dict[str, float]:
        return max(rows, key=lambda r: r["per_s"])

    d, h = best(results["direct"]), best(results["http"])
    print(f"POST /runs, {args.clients} concurrent clients, {os.cpu_count()} cores (best of 2)")
    print(f"  {'':22}{'runs/s':>9}{'p50 ms':>9}{'p95 ms':>9}")
    print(f"  {'Client.enqueue (floor)':22}{d['per_s']:9.0f}{d['p50_ms']:9.1f}{d['p95_ms']:9.1f}")
    print(f"  {'POST /runs over HTTP':22}{h['per_s']:9.0f}{h['p50_ms']:9.1f}{h['p95_ms']:9.1f}")
    print(f"  HTTP keeps {h['per_s'] / d['per_s']:.2f}x of the floor's throughput")
    print(f"run page with {args.steps} steps ({size / 1024:.0f} KiB of HTML)")
    print(
        f"  server: page {median(server_ms):.0f} ms, live part {median(partial_ms):.0f} ms (median of 10)"
    )
    shown = f"{load_ms:.0f} ms" if isinstance(load_ms, float | int) else load_ms
    print(f"  headless Chromium, navigation start to load event: {shown} (median of 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
