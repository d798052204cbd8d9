"""`cairn demo`: a fleet of real workers doing invoice runs while workers are SIGKILLed.

It starts the local stand-ins (mail API; a Messages API server unless ANTHROPIC_API_KEY
is set), K worker processes and the reaper, enqueues the runs, kills a pool child in the
middle of an email step and then a whole worker (starting a replacement), waits for every
run, and counts emails attempted and delivered at the mail API.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

import cairn.testing.demos.invoice  # noqa: F401  (registers invoice: inputs checked here)
from cairn.client.client import Client
from cairn.core.records import RunFilter
from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store import Leases, admin, upgrade
from cairn.testing import fleet
from cairn.testing.standins import MailServer, ModelServer

if TYPE_CHECKING:
    from cairn.store import CheckpointStore, Run

STATE = fleet.STATE / "demo"


def run_demo(
    settings: Settings,
    runs: int = 20,
    workers: int = 2,
    quiet: bool = False,
    serve_port: int | None = None,
    on_summary: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The demo's summary. With serve_port, `cairn serve` shows the runs on that port
    while they run, and goes on serving after the summary until Ctrl-C."""
    err = Console(stderr=True)
    # The demo's own Redis database, flushed: old messages cannot leak into it.
    redis_url = admin.with_path(settings.redis_url, "14")
    upgrade(settings.database_url)
    redis_db = admin.RedisDatabase(redis_url)
    redis_db.flush()
    STATE.mkdir(parents=True, exist_ok=True)
    mail, model = _start_standins(settings, err)
    env = _worker_env(settings, redis_url, mail, model)
    client = Client(settings=settings.with_options(redis_url=redis_url, broker_url=redis_url))
    crew = _Crew(env, time.strftime("%H%M%S"), err, mail, Leases.from_url(redis_url))
    started = time.monotonic()
    try:
        page = f"http://127.0.0.1:{serve_port or settings.web_port}/ui/runs"
        crew.start(workers, serve_port, page)
        ids = _enqueue(client, runs, crew.stamp)
        _watch(client.store, ids, crew, quiet)
        elapsed = time.monotonic() - started
        rows = _rows(client.store, ids)
        summary = _summary(settings, rows, ids, crew, workers, elapsed, real_model=model is None)
        if not quiet:
            _print_summary(Console(), summary)
        if on_summary is not None:
            on_summary(summary)
        _serve_or_hint(crew, rows, page, serve_port)
        return summary
    finally:
        crew.kill()
        mail.stop()
        if model:
            model.stop()
        client.close()
        crew.leases.client.close()
        redis_db.close()


def _start_standins(settings: Settings, err: Console) -> tuple[MailServer, ModelServer | None]:
    """The mail API stand-in, and the Messages API one unless ANTHROPIC_API_KEY is set
    (None: the real API), each announced."""
    mail = MailServer(delay_ms=300).start()
    real_model = bool(os.environ.get("ANTHROPIC_API_KEY")) and not settings.anthropic_base_url
    model = None if real_model else ModelServer(delay_ms=250).start()
    err.print(
        f"[bold]mail API[/]: local stand-in at {mail.url} (records and dedupes on Idempotency-Key)"
    )
    if model:
        err.print(
            f"[bold]model[/]: ANTHROPIC_API_KEY is unset, so the anthropic SDK is pointed at a local "
            f"server speaking the Messages API at {model.url} (deterministic replies)"
        )
    else:
        err.print(f"[bold]model[/]: the Anthropic API ({settings.model}) with ANTHROPIC_API_KEY")
    return mail, model


def _worker_env(
    settings: Settings, redis_url: str, mail: MailServer, model: ModelServer | None
) -> dict[str, str]:
    """The environment of the demo's processes: its Redis database, the stand-ins, a short
    lease TTL and reaper interval (a killed run goes on within seconds), its workflow."""
    base_url = settings.anthropic_base_url or (model.url if model else "")
    lease_ttl = 5.0
    env = fleet.child_env(
        CAIRN_REDIS_URL=redis_url,
        CAIRN_DATABASE_URL=settings.database_url,
        CAIRN_MAIL_URL=mail.url,
        CAIRN_LEASE_TTL=str(lease_ttl),
        CAIRN_REAPER_INTERVAL="1",
        CAIRN_DEFER_SECONDS="1",
        # The demo's own workflow, which no worker loads unless told to.
        CAIRN_WORKFLOWS="cairn.testing.demos.invoice",
    )
    if base_url:
        env["ANTHROPIC_BASE_URL"] = base_url
    return env


def _enqueue(client: Client, runs: int, stamp: str) -> list[str]:
    """Enqueue the invoice runs; their ids."""
    return [
        client.enqueue(
            "invoice",
            {"customer": f"customer-{i}", "email": f"billing{i}@example.com"},
            run_id=f"demo-{stamp}-{i:02d}-{uuid.uuid4().hex[:4]}",
        )
        for i in range(runs)
    ]


def _rows(store: CheckpointStore, ids: list[str]) -> dict[str, Run]:
    """The demo's runs as listed now, by run id."""
    return {r.run_id: r for r in store.list_runs(RunFilter(limit=10_000)) if r.run_id in ids}


def _watch(store: CheckpointStore, ids: list[str], crew: _Crew, quiet: bool) -> None:
    """Until every run finished or failed (240 s at most): show the progress, and kill
    (_Crew.maybe_kill) while runs are running."""
    with fleet.runs_progress(crew.err, quiet) as progress:
        bar = progress.add_task("", total=len(ids))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            rows = _rows(store, ids)
            finished = sum(r.status in (RunStatus.DONE, RunStatus.FAILED) for r in rows.values())
            active = [r for r in rows.values() if r.status == RunStatus.RUNNING]
            progress.update(
                bar,
                completed=finished,
                description=f"running {len(active)} · kills {len(crew.kills)} · "
                f"emails {crew.mail.stats()['deliveries']}",
            )
            if finished == len(ids):
                break
            crew.maybe_kill(active)
            time.sleep(0.05)


def _summary(
    settings: Settings,
    rows: dict[str, Run],
    ids: list[str],
    crew: _Crew,
    workers: int,
    elapsed: float,
    *,
    real_model: bool,
) -> dict[str, Any]:
    """What the runs, the invoice ledger and the mail API recorded; summary["ok"] is the
    verdict: every run done, each email delivered once, at least one kill."""
    runs, kills = len(ids), crew.kills
    (ledger_rows,) = admin.execute(
        settings.database_url,
        "SELECT count(*) AS n FROM invoice_ledger WHERE run_id = ANY(%s)",
        (ids,),
    )
    stats = crew.mail.stats()
    summary = {
        "runs": runs,
        "workers": workers,
        "runs_finished": sum(r.status == RunStatus.DONE for r in rows.values()),
        "runs_failed": sum(r.status == RunStatus.FAILED for r in rows.values()),
        "runs_resumed": sum(r.resumes > 0 for r in rows.values()),
        "kills": kills,
        "emails_attempted": stats["attempts"],
        "emails_delivered": stats["deliveries"],
        "emails_deduplicated": stats["deduplicated"],
        "duplicate_deliveries": stats["duplicate_deliveries"],
        "ledger_rows": ledger_rows["n"],
        "cost_usd": round(sum(r.cost_usd for r in rows.values()), 6),
        "seconds": round(elapsed, 1),
        "model": "anthropic" if real_model else "local stand-in",
    }
    summary["ok"] = (
        summary["runs_finished"] == runs
        and summary["duplicate_deliveries"] == 0
        and summary["emails_delivered"] == runs
        and summary["ledger_rows"] == runs
        and len(kills) >= 1
    )
    return summary


def _serve_or_hint(crew: _Crew, rows: dict[str, Run], page: str, serve_port: int | None) -> None:
    """With serve_port, go on serving the runs until Ctrl-C; else say how to see them."""
    err = crew.err
    resumed = next((r.run_id for r in rows.values() if r.resumes), None)
    if serve_port:
        err.print(f"a run resumed after a kill: {page}/{resumed}" if resumed else "")
        err.print(f"serving the runs at {page} until Ctrl-C")
        _until_interrupted(crew.procs[-1].alive)
    else:
        err.print(
            f"see the runs and their step timelines: `cairn demo --serve`, or "
            f"`cairn serve --insecure-no-auth` and {page}",
            soft_wrap=True,
        )


def _until_interrupted(going: Callable[[], bool]) -> None:
    """Until Ctrl-C (SIGINT), or going() says no. The signal sets a flag this loop reads
    rather than raising KeyboardInterrupt wherever the main thread happens to be (in the
    middle of a Popen's bookkeeping, a print); Ctrl-Cs after the first are ignored: they
    must not cut the clean-up short and orphan the workers."""
    asked: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: asked.append(signum))
    try:
        while not asked and going():
            time.sleep(0.1)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclasses.dataclass
class _Crew:
    """The demo's processes (workers, the beat, the server) and the kills among them."""

    env: dict[str, str]
    stamp: str  # in the names of their log files
    err: Console
    mail: MailServer
    leases: Leases
    procs: list[fleet.Proc] = dataclasses.field(default_factory=list)
    kills: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def start(self, workers: int, serve_port: int | None, page: str) -> None:
        """The workers (2 processes each), the beat (the reaper), and with serve_port
        `cairn serve` on it."""
        env, stamp = self.env, self.stamp
        self.err.print(f"starting {workers} workers (2 processes each) and the reaper…")
        for i in range(workers):
            self.procs.append(
                fleet.start_worker(env, STATE / f"worker-{stamp}-{i}.log", f"demo{i}", 2)
            )
        self.procs.append(
            fleet.start_beat(env, STATE / f"beat-{stamp}.log", STATE / "beat-schedule")
        )
        if serve_port:
            # On loopback only; with CAIRN_API_TOKEN set the page asks for it.
            open_door = () if os.environ.get("CAIRN_API_TOKEN") else ("--insecure-no-auth",)
            self.procs.append(
                fleet.start_server(env, STATE / f"serve-{stamp}.log", serve_port, *open_door)
            )
            self.err.print(f"[bold]watch the runs[/]: {page}")

    def maybe_kill(self, active: list[Run]) -> None:
        """First a pool child whose email went out but whose checkpoint is not saved yet
        (the replay trap), then a whole worker mid-run."""
        kills, err = self.kills, self.err
        if len(kills) >= 2:
            return
        sent = self.mail.stats()["by_ref"]
        for row in active:
            if not kills and not (row.cursor == "send_email" and row.run_id in sent):
                continue
            holder = self.leases.holder(row.run_id)
            if holder is None:
                continue
            pid = holder.pid
            if not kills:
                os.kill(pid, signal.SIGKILL)
                kills.append(
                    {"kind": "pool child", "pid": pid, "run": row.run_id, "step": row.cursor}
                )
                err.print(
                    f"[red]SIGKILL[/] pool process {pid} right after {row.run_id} sent its "
                    "email, before its checkpoint: the broker redelivers the run"
                )
                return
            owner = next((p for p in self.procs if p.alive() and pid in p.children()), None)
            if owner is None:
                continue
            owner.kill()
            kills.append(
                {"kind": "whole worker", "pid": owner.pid, "run": row.run_id, "step": row.cursor}
            )
            err.print(
                f"[red]SIGKILL[/] whole worker {owner.name} (pid {owner.pid} and its pool) while "
                f"{row.run_id} was at {row.cursor}; starting a replacement; the reaper "
                "re-enqueues its runs when their leases expire"
            )
            self.procs.append(
                fleet.start_worker(self.env, STATE / f"worker-{self.stamp}-r.log", "demo-r", 2)
            )
            return

    def kill(self) -> None:
        """Kill every process the demo started: all at once, then each reaped (one by one,
        each waited for while the others still stood, was seconds on a busy host)."""
        for p in self.procs:
            p.signal_all(signal.SIGCONT)
            p.signal_all(signal.SIGKILL)
        for p in self.procs:
            p.kill()  # dead already: reaped at once


def _print_summary(out: Console, s: dict[str, Any]) -> None:
    table = Table(title="cairn demo", show_header=False)
    for label, key in (
        ("runs finished", "runs_finished"),
        ("runs failed", "runs_failed"),
        ("runs resumed after a kill", "runs_resumed"),
        ("emails attempted", "emails_attempted"),
        ("emails delivered", "emails_delivered"),
        ("replays deduplicated", "emails_deduplicated"),
        ("duplicate deliveries", "duplicate_deliveries"),
        ("ledger rows", "ledger_rows"),
        ("model cost (USD)", "cost_usd"),
        ("seconds", "seconds"),
    ):
        table.add_row(label, str(s[key]))
    table.add_row(
        "kills", "; ".join(f"{k['kind']} pid {k['pid']} at {k['step']}" for k in s["kills"])
    )
    out.print(table)
    verdict = "[bold green]OK[/]" if s["ok"] else "[bold red]FAILED[/]"
    out.print(f"{verdict}: every run finished, each email delivered once" if s["ok"] else verdict)
