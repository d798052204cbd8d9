"""What one chaos run is set up to do: its options, with every default filled in."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.store.admin import with_path
from cairn.testing import demos, fleet

CHAOS_REDIS_DB = 13
SENTINEL = "chaos:sentinel"
STATE = fleet.STATE / "chaos"

DEFAULT_INPUTS: dict[str, dict[str, Any]] = {
    "invoice": {"customer": "customer-{i}", "email": "billing{i}@example.com"},
    "unkeyed": {"customer": "customer-{i}", "email": "billing{i}@example.com"},
    "agent": {"topic": "topic {i}", "email": "agent{i}@example.com"},
    "agent_async": {"topic": "topic {i}", "email": "agent{i}@example.com"},
    # The stand-in streams the REPLY line's words, TOKEN_MS apart: a kill or a pause can
    # land mid-answer.
    "chat": {
        "prompt": "REPLY: answer {i} comes back to the reader one word at a time\nTOKEN_MS: 5",
        "email": "chat{i}@example.com",
    },
    "graph_agent": {"question": "Order {i} arrived broken.", "email": "support{i}@example.com"},
    # Two tools and a handoff, one a turn (the stand-in's script): four model requests.
    "oa_agent": {
        "prompt": "TOOLS: lookup, notify, transfer_to_billing\nOrder {i} was charged twice.",
        "email": "support{i}@example.com",
    },
}


def chaos_redis_url(url: str) -> str:
    """The chaos Redis database (index CHAOS_REDIS_DB) on the server of url."""
    return with_path(url, str(CHAOS_REDIS_DB))


def fill(value: Any, i: int) -> Any:
    """Replace "{i}" in every string of the input with the run's index."""
    if isinstance(value, str):
        return value.replace("{i}", str(i))
    if isinstance(value, list):
        return [fill(v, i) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, i) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    """One chaos run's options, resolved (run_chaos documents their defaults)."""

    workflow: str
    runs: int
    workers: int
    input: dict[str, Any] | None  # as given: None means DEFAULT_INPUTS (and no --input)
    seed: int
    rate: float
    kills: list[tuple[str, int, str]] | None  # as given, for the plan and the replay
    random_kills: int
    concurrency: int
    pool: str  # the workers' Celery pool: prefork, or threads (a kill takes the whole worker)
    lease_ttl: float
    deadline: float
    pending_after: float
    mail_delay_ms: int
    model_delay_ms: int
    base_db: str  # the server the chaos database is created next to
    redis_url: str
    broker_url: str | None  # a RabbitMQ vhost, emptied at start (None: the Redis database)
    modules: tuple[str, ...]  # the workers' CAIRN_WORKFLOWS, a demo's module included
    keep: bool
    signals: bool  # invoice runs wait for a payment signal, which chaos sends
    cancel_rate: float  # share of runs cancelled while they run
    db_name: str
    state: Path
    quiet: bool
    keys: int = 0  # runs spread over this many concurrency keys (0: none)
    key_limit: int = 1  # each key's runs at a time
    replay_failed: bool = False  # every run fails first (sends refused), then is replayed
    pauses: int = 0  # SIGSTOPs past the lease TTL (a pool child, or a whole worker)
    deploy: str | None = None  # the module a rolling deploy swaps the workers to

    def template(self) -> dict[str, Any]:
        """Each run's input before "{i}" is filled in."""
        base = self.input if self.input is not None else DEFAULT_INPUTS.get(self.workflow, {})
        if self.signals:
            # Long enough that only a lost signal could leave a run unpaid.
            return {**base, "await_payment": True, "payment_timeout_s": 10 * self.deadline}
        return base

    def replay(self) -> str:
        """The `cairn chaos` command line that replays this run's kill schedule."""
        return (
            f"cairn chaos {self.workflow} --runs {self.runs} --workers {self.workers} "
            f"--seed {self.seed} --rate {self.rate:g} --lease-ttl {self.lease_ttl:g}"
            + self._extra_args()
        )

    def _extra_args(self) -> str:
        args = []
        if self.input is not None:
            args += ["--input", json.dumps(self.input)]
        given = [m for m in self.modules if m not in demos.MODULES]  # chaos adds those
        if given:
            args += ["--workflows", ",".join(given)]
        if self.concurrency != 2:
            args += ["--concurrency", str(self.concurrency)]
        if self.pool != "prefork":
            args += ["--pool", self.pool]
        if self.signals:
            args += ["--signals"]
        if self.cancel_rate:
            args += ["--cancel-rate", f"{self.cancel_rate:g}"]
        if self.keys:
            args += ["--keys", str(self.keys), "--key-limit", str(self.key_limit)]
        if self.replay_failed:
            args += ["--replay-failed"]
        if self.pauses:
            args += ["--pauses", str(self.pauses)]
        if self.deploy:
            args += ["--deploy", self.deploy]
        for run_id, seq, boundary in self.kills or []:
            args += ["--kill", f"{run_id}:{seq}:{boundary}"]
        return "".join(" " + shlex.quote(a) for a in args)
