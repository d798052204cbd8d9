"""The fleet-wide model rate limit: `run()`, wired into `python -m bench --only flow`.

`workers` processes (real ones, each with `threads` threads) call ModelClient as fast
as it lets them for `seconds`, against a limit of `rpm` requests a minute kept in Redis.
The Messages-API stand-in (its own process) enforces the same limit with a bucket of a
second's requests (2 at least): a fleet whose processes each kept to the limit alone
would send it `workers` times too many and be answered 429 within a second.
Measured: requests a minute observed (answers after the first second) against rpm,
the most answers in any 60 s (when the run is that long), and the stand-in's 429s.

The callers are forked from this process once it has loaded the SDK (loading it takes
seconds on a busy machine, and the start is a barrier in Redis anyway).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import sys
import threading
import time
import uuid
from typing import Any

from bench.common import ROOT, progress

LOGS = ROOT / ".cairn" / "bench-ratelimit"
TARGET_RATIO, TARGET_429 = 0.05, 0  # observed rpm within 5% of the limit; no 429 at all


def call(spec: dict[str, Any], out: Any) -> None:
    """One worker process: its threads call the model until the deadline (wall clock);
    their answers' wall times go to `out` (a multiprocessing connection)."""
    import redis

    from bench.internals import Limit, ModelClient, RateLimiter

    r = redis.Redis.from_url(spec["redis_url"])
    limiter = RateLimiter(r, Limit(rpm=spec["rpm"]))
    client = ModelClient(base_url=spec["model_url"], limiter=limiter, wait_max=spec["wait_max"])
    r.incr(spec["ready_key"])  # the SDK is loaded (seconds on a busy machine): ready
    while (go := r.get(spec["go_key"])) is None:
        time.sleep(0.01)
    start, end = json.loads(go)
    answered: list[float] = []
    deferred = [0]

    def loop() -> None:
        while time.time() < end:
            try:
                client.create(
                    model=spec["model"], max_tokens=16, messages=[{"role": "user", "content": "hi"}]
                )
            except Exception as exc:  # RateLimited: counted; anything else ends the thread
                if type(exc).__name__ != "RateLimited":
                    raise
                deferred[0] += 1
                continue
            answered.append(time.time())

    time.sleep(max(start - time.time(), 0))
    threads = [threading.Thread(target=loop) for _ in range(spec["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    out.send({"answered": answered, "deferred": deferred[0]})


def run(
    redis_url: str,
    *,
    rpm: int = 600,
    workers: int = 4,
    threads: int = 4,
    seconds: float = 60.0,
    wait_max: float = 10.0,
) -> dict[str, Any]:
    """A limit of `rpm` requests a minute across `workers` processes for `seconds`:
    requests a minute observed against it and the stand-in's 429s (targets: within 5%,
    and 0). redis_url: a database of its own is not needed (the model name is fresh)."""
    import httpx
    import redis

    from bench.internals import preload_sdk
    from bench.procs import model_standin

    preload_sdk()
    burst = str(max(2, math.ceil(rpm / 60)))
    standin, url = model_standin(LOGS / "model.log", "--rpm", str(rpm), "--burst", burst)
    r = redis.Redis.from_url(redis_url)
    # A fresh bucket, and the barrier's keys; claude-* so the call goes to the Messages API.
    name = f"claude-bench-ratelimit-{uuid.uuid4().hex[:8]}"
    procs: list[Any] = []
    try:
        spec = {
            "redis_url": redis_url,
            "model_url": url,
            "model": name,
            "rpm": rpm,
            "threads": threads,
            "wait_max": wait_max,
            "ready_key": f"{name}:ready",
            "go_key": f"{name}:go",
        }
        progress(f"ratelimit: {workers} processes x {threads} threads at {rpm}/min, {seconds:g}s")
        fork = multiprocessing.get_context("fork")
        pipes = [fork.Pipe(duplex=False) for _ in range(workers)]
        procs = [fork.Process(target=call, args=(spec, w), daemon=True) for _, w in pipes]
        for p in procs:
            p.start()
        while int(r.get(spec["ready_key"]) or 0) < workers:
            if not all(p.is_alive() for p in procs):
                raise RuntimeError("a caller process exited before it was ready")
            time.sleep(0.05)
        start = time.time() + 0.2
        r.set(spec["go_key"], json.dumps([start, start + seconds]), ex=600)
        results = []
        for (answers, _), p in zip(pipes, procs, strict=True):
            if not answers.poll(seconds + wait_max + 60):
                raise RuntimeError(f"caller {p.pid} sent no answers (exit code {p.exitcode})")
            results.append(answers.recv())
            p.join(10)
        stats = httpx.get(f"{url}/_stats", timeout=10).json()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        standin.kill()
        r.delete(f"{name}:ready", f"{name}:go")
        r.close()
    times = sorted(t for res in results for t in res["answered"])
    # Counted over fixed ends, the first second left out (connections being opened), so
    # one late answer moves the count by one, not the span it is divided by.
    settled = [t for t in times if start + 1 <= t < start + seconds]
    observed = len(settled) / (seconds - 1) * 60
    busiest = max((sum(1 for t in times[i:] if t < s + 60) for i, s in enumerate(times)), default=0)
    return {
        "rpm": rpm,
        "workers": workers,
        "threads": threads,
        "seconds": seconds,
        "requests": len(times),
        "observed_rpm": round(observed, 1),
        "ratio": round(observed / rpm, 4),
        "target_ratio": TARGET_RATIO,
        # Only a run of a minute or more has a full 60 s window to count.
        "max_in_60s": busiest if seconds >= 60 else None,
        "deferred": sum(res["deferred"] for res in results),
        "standin_429": stats["rate_limited"],
        "target_429": TARGET_429,
        "ok": abs(observed / rpm - 1) <= TARGET_RATIO and stats["rate_limited"] == TARGET_429,
    }


if __name__ == "__main__":  # python -m bench.ratelimit REDIS_URL [SECONDS [RPM]]
    args = sys.argv[1:]
    seconds, rpm = float(args[1]) if len(args) > 1 else 60.0, int(args[2]) if len(args) > 2 else 600
    print(json.dumps(run(args[0], rpm=rpm, seconds=seconds)))
