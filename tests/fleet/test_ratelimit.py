"""Fleet-wide model rate limits kept by several real processes together."""

from __future__ import annotations

import time
from typing import Any

import pytest

import cairn
from bench import ratelimit as bench
from cairn.testing.standins import ModelServer


def test_four_processes_keep_to_the_limit_together(redis_url: str) -> None:
    # 600/min is 10 a second: 4 processes x 3 threads would send far more alone, and the
    # stand-in's bucket holds a second's worth, so going over shows up as 429s.
    out = bench.run(redis_url, rpm=600, workers=4, threads=3, seconds=8.0)
    assert out["standin_429"] == 0
    assert out["deferred"] == 0
    assert abs(out["ratio"] - 1) <= 0.05, out


@pytest.mark.parametrize("name", ["claude-haiku-4-5", "gpt-4o-mini"])
def test_a_real_fleet_keeps_to_the_limit_and_every_run_finishes(
    name: str, client: cairn.Client, start_worker: Any
) -> None:
    """Two `cairn worker`s of three processes each run 12 streamed chat runs against a
    stand-in that allows 120 requests a minute with a bucket of 2, as Anthropic's Messages
    API or OpenAI's Chat Completions (CAIRN_MODEL says which). Alone, six processes would
    send them within a second; CAIRN_MODEL_RPM=120 spaces them fleet-wide (0.5 s apart),
    so the stand-in answers no 429 and every run ends."""
    with ModelServer(rpm=120, burst=2) as limited:
        env = {
            "ANTHROPIC_BASE_URL": limited.url,
            "OPENAI_BASE_URL": limited.openai_url,
            "CAIRN_MODEL": name,
            "CAIRN_MODEL_RPM": "120",
            "CAIRN_RATE_WAIT_MAX": "30",
        }
        start_worker(concurrency=3, **env)
        start_worker(concurrency=3, **env)
        ids = [client.enqueue("chat", {"prompt": f"hi {i}", "max_tokens": 16}) for i in range(12)]
        started = time.monotonic()
        for run_id in ids:
            assert client.wait(run_id, timeout=90).status == cairn.RunStatus.DONE
        elapsed = time.monotonic() - started
        stats = limited.stats()
    assert stats["rate_limited"] == 0, stats
    assert stats["requests"] == 12, stats
    if name.startswith("gpt-"):  # each went where CAIRN_MODEL said
        assert stats["by_api"]["chat.completions"]["requests"] == 12, stats
    assert elapsed >= 11 * 0.5 * 0.9  # the spacing: what a limit that let them all go lacks
