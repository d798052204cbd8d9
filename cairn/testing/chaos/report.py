"""What a chaos run recorded, turned into its report: per step (attempts, sends,
deliveries, duplicates), per run (finished, failed, lost, resumed), kills per boundary and
the time from each kill to the run continuing under another owner, pauses; and how it
prints (with the graph forks and stream checks of chaos.record, which the runner adds)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from cairn.core.status import RunStatus
from cairn.testing.chaos.history import check_history
from cairn.testing.chaos.pauses import taken_over
from cairn.testing.faults import BOUNDARIES, CALL_BOUNDARIES

if TYPE_CHECKING:
    from cairn.testing.chaos.config import ChaosConfig
    from cairn.testing.chaos.lifecycle import Lifecycle


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return round(ordered[int(rank) - 1], 3)


def recoveries(kills: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each (kill, run): seconds from the kill to the run's first checkpoint row
    written under a newer epoch (another owner), or why there is none."""
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[row["run_id"]].append(row)
    out = []
    for kill in kills:
        for run_id in kill.get("runs") or [kill["run_id"]]:
            history = by_run.get(run_id, [])
            before = [r for r in history if r["at"] <= kill["ts"]]
            after = [r for r in history if r["at"] > kill["ts"]]
            entry = {
                "kind": kill["kind"],
                "run_id": run_id,
                "seconds": None,
                "note": "",
                "at": kill.get("boundary") or "outside",
                "cursor": kill.get("cursor"),
            }
            if before and before[-1]["status"] in (RunStatus.DONE, RunStatus.FAILED):
                entry["note"] = "run had already finished"
            else:
                epoch = max((r["epoch"] for r in before), default=0)
                nxt = next((r for r in after if r["epoch"] > epoch), None)
                if nxt is None:
                    entry["note"] = "never continued"
                else:
                    entry["seconds"] = round(nxt["at"] - kill["ts"], 3)
            out.append(entry)
    return out


def step_report(
    events: list[dict[str, Any]], attempts: dict[str, int], order: list[str]
) -> list[dict[str, Any]]:
    """Per step: attempts, sends, deliveries, dedupes, keys, duplicates.

    A delivery belongs to a step visit (run, seq, cursor), known from the X-Cairn-Step
    header (or, without it, from a cairn idempotency key), and to one journaled call of it
    if its key is a call's. A duplicate is a delivery of a visit (or call) by an attempt
    other than the first one that delivered it: the customer got the effect twice.
    """
    steps: dict[str, dict[str, Any]] = {}

    def row(cursor: str) -> dict[str, Any]:
        return steps.setdefault(
            cursor,
            {
                "step": cursor,
                "attempts": attempts.get(cursor, 0),
                "sends": 0,
                "delivered": 0,
                "deduplicated": 0,
                "keyed": 0,
                "unkeyed": 0,
                "keys": 0,
                "max_per_key": 0,
                "visits": 0,
                "duplicates": 0,
            },
        )

    per_visit: dict[tuple[str, str], dict[Any, int]] = defaultdict(lambda: defaultdict(int))
    per_key: dict[tuple[str, str], int] = defaultdict(int)
    for e in events:
        run = cursor = visit = attempt = None
        if e.get("step"):
            parts = e["step"].split(" ")
            if len(parts) == 4:
                run, visit, cursor, attempt = parts[0], f"seq{parts[1]}", parts[2], parts[3]
        if cursor is None and e.get("key", "") and e["key"].startswith("cairn:"):
            parts = e["key"].split(":")
            if len(parts) >= 4:
                run, cursor, visit = parts[1], parts[2], f"visit{parts[3]}"
        if cursor is None:
            cursor, run, visit = "?", "?", e.get("id")
        r = row(cursor)
        r["sends"] += 1
        if not e["delivered"]:
            r["deduplicated"] += 1
            continue
        r["delivered"] += 1
        r["keyed" if e.get("key") else "unkeyed"] += 1
        if e.get("key"):
            per_key[(cursor, e["key"])] += 1
        # A journaled call's key (cairn:run:cursor:visit:name:n) is an effect of its own:
        # the replay that skips the calls already made sends the later ones, and those
        # are the first (not a second) delivery of their slot.
        key_parts = (e.get("key") or "").split(":")
        slot = ":".join(key_parts[4:]) if len(key_parts) >= 6 else ""  # names may hold ":"
        per_visit[(cursor, f"{run}|{visit}|{slot}")][attempt] += 1
    for (cursor, _), by_attempt in per_visit.items():
        r = row(cursor)
        r["visits"] += 1
        total = sum(by_attempt.values())
        if None in by_attempt:  # attempt unknown: any second delivery is a duplicate
            r["duplicates"] += total - 1
        else:
            first = min(by_attempt, key=lambda a: int(a))
            r["duplicates"] += total - by_attempt[first]
    for (cursor, _), n in per_key.items():
        r = row(cursor)
        r["keys"] += 1
        r["max_per_key"] = max(r["max_per_key"], n)
    for cursor in order:
        if attempts.get(cursor):
            row(cursor)
    rank = {c: i for i, c in enumerate(order)}
    return sorted(steps.values(), key=lambda s: rank.get(s["step"], len(rank)))


def build_report(
    config: ChaosConfig,
    *,
    flow_steps: list[str],
    elapsed: float,
    final: list[dict[str, Any]],
    history: list[dict[str, Any]],
    kills: list[dict[str, Any]],
    attempts: dict[str, int],
    events: list[dict[str, Any]],
    warnings: list[str] | None = None,
    queue_depths: list[int] | None = None,
    lifecycle: Lifecycle | None = None,
    model_requests: int | None = None,
    journaled: dict[str, int] | None = None,
    pauses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report of one chaos run from what it recorded; report["ok"] is the verdict:
    every run finished, no effect delivered twice, no checkpoint went backwards."""
    pauses = pauses or []
    done, failed, cancelled, incompatible, lost = _ended(final)
    rec = recoveries([k for k in kills if k.get("run_id") or k.get("runs")], history)
    backwards = check_history(history)
    steps = step_report(events, attempts, flow_steps)
    # A pause cuts a call short as a kill does: the zombie's answer is never recorded.
    model = _model_check(model_requests, journaled or {}, kills + pauses)
    life: dict[str, Any] = {}
    problems = _problems(config, lost, failed, steps, model)
    if incompatible and not config.deploy:  # a deploy's are judged by chaos.deploy
        problems.append(
            f"{len(incompatible)} run(s) stopped incompatible (e.g. "
            f"{incompatible[0]['run_id']}: {(incompatible[0]['error'] or '')[:200]})"
        )
    if lifecycle is not None:
        life, life_problems = lifecycle.verdict(final, events)
        problems.extend(life_problems)
    problems.extend(backwards[:20])
    if len(backwards) > 20:
        problems.append(f"... and {len(backwards) - 20} more history violations")
    return {
        "ok": not problems,
        "problems": problems,
        "warnings": warnings or [],
        **_setup(config),
        "seconds": round(elapsed, 1),
        "runs_finished": len(done),
        "runs_failed": len(failed),
        "runs_lost": len(lost),
        "runs_cancelled": len(cancelled),
        "runs_incompatible": len(incompatible),
        "lifecycle": life,
        "runs_resumed": sum(1 for r in final if r["resumes"] > 0),
        "resumes": sum(r["resumes"] for r in final),
        "kills": _per_boundary(kills),
        "kills_total": len(kills),
        "random_kills_planned": config.random_kills,
        "pauses": len(pauses),
        "pauses_whole_worker": sum(1 for p in pauses if p["kind"] == "whole_worker"),
        "pauses_taken_over": taken_over(pauses, history),
        "pause_log": pauses,
        "recovery": _recovery(rec),
        "queue_depth": {
            "p50": percentile([float(d) for d in queue_depths or []], 50),
            "max": max(queue_depths or [0]),
        },
        "steps": steps,
        "model": model,
        "journaled": journaled or {},
        "duplicates": sum(s["duplicates"] for s in steps),
        "history_rows": len(history),
        "history_violations": len(backwards),
        "kill_log": kills,
        "database": config.db_name + (" (kept)" if config.keep else " (dropped)"),
        "logs": str(config.state),
    }


def _ended(final: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], ...]:
    """The runs by how they ended: done, failed, cancelled, incompatible, and lost (not
    ended at all, or stopped otherwise)."""
    ended = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INCOMPATIBLE)
    by = [[r for r in final if r["status"] == status] for status in ended]
    return (*by, [r for r in final if r["status"] not in ended])


def _setup(config: ChaosConfig) -> dict[str, Any]:
    """What the run was set up to do, as the report shows it."""
    return {
        "workflow": config.workflow,
        "seed": config.seed,
        "rate": config.rate,
        "replay": config.replay(),
        "runs": config.runs,
        "workers": config.workers,
        "concurrency": config.concurrency,
        "lease_ttl": config.lease_ttl,
    }


def _problems(
    config: ChaosConfig,
    lost: list[dict[str, Any]],
    failed: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    model: dict[str, Any],
) -> list[str]:
    """What broke among the runs, the steps' deliveries and the model calls."""
    problems: list[str] = []
    if lost:
        problems.append(
            f"{len(lost)} run(s) lost: not finished within {config.deadline:g}s "
            f"(e.g. {lost[0]['run_id']} at {lost[0]['cursor']})"
        )
    if failed:
        problems.append(
            f"{len(failed)} run(s) failed (e.g. {failed[0]['run_id']}: "
            f"{(failed[0]['error'] or '')[:200]})"
        )
    for s in steps:
        if s["duplicates"]:
            how = "without an idempotency key" if s["unkeyed"] else "with idempotency keys"
            problems.append(
                f"step {s['step']!r} delivered {s['duplicates']} duplicate effect(s) ({how})"
            )
    if model["excess"] > 0:
        problems.append(
            f"{model['requests']} model requests for {model['journaled']} journaled model "
            f"calls and {model['in_flight_allowed']} calls a kill may have cut short: "
            f"{model['excess']} made again after their result was recorded"
        )
    return problems


def _per_boundary(kills: list[dict[str, Any]]) -> dict[str, int]:
    """Kills at each step and call boundary, and from outside (a pool child, a worker)."""
    per_boundary = {
        b: sum(1 for k in kills if k.get("boundary") == b) for b in (*BOUNDARIES, *CALL_BOUNDARIES)
    }
    per_boundary["random_pool_child"] = sum(1 for k in kills if k["kind"] == "pool_child")
    per_boundary["whole_worker"] = sum(1 for k in kills if k["kind"] == "whole_worker")
    return per_boundary


def _recovery(rec: list[dict[str, Any]]) -> dict[str, Any]:
    """How long runs took to go on after a kill (recoveries), pool child and whole worker
    apart, and the slowest three."""
    child = [e["seconds"] for e in rec if e["kind"] != "whole_worker" and e["seconds"] is not None]
    whole = [e["seconds"] for e in rec if e["kind"] == "whole_worker" and e["seconds"] is not None]
    return {
        "pool_child": _spread(child),
        "whole_worker": _spread(whole),
        "after_run_finished": sum(1 for e in rec if e["note"] == "run had already finished"),
        "never_continued": sum(1 for e in rec if e["note"] == "never continued"),
        "slowest": sorted(
            (e for e in rec if e["seconds"] is not None), key=lambda e: -e["seconds"]
        )[:3],
    }


def _spread(seconds: list[float]) -> dict[str, Any]:
    return {
        "n": len(seconds),
        "p50": percentile(seconds, 50),
        "p95": percentile(seconds, 95),
        "max": percentile(seconds, 100),
    }


def print_report(report: dict[str, Any], console: Any = None) -> None:
    """Print a chaos report as two tables and the verdict (on console, else stdout)."""
    from rich.console import Console

    out = console or Console()
    out.print(_steps_table(report))
    out.print(_summary_table(report))
    for w in report.get("warnings", []):
        out.print(f"[yellow]warning[/]: {w}")
    if report["ok"] and report.get("deploy"):
        out.print(
            "[bold green]OK[/]: every run done or stopped incompatible with its reason, no "
            "effect delivered twice, no slot leaked, no checkpoint went backwards, no graph "
            "forked, every stream told its steps"
        )
    elif report["ok"]:
        out.print(
            "[bold green]OK[/]: every run finished, no effect delivered twice, "
            "no checkpoint went backwards, no graph forked, every stream told its steps"
        )
    else:
        out.print("[bold red]FAILED[/]:")
        for p in report["problems"]:
            out.print(f"  - {p}")


def _steps_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    steps = Table(title=f"cairn chaos {report['workflow']}: per step")
    for col in ("step", "tries", "sends", "sent", "dedup", "keys", "max/key", "no key", "dups"):
        steps.add_column(col, justify="left" if col == "step" else "right", no_wrap=True)
    for s in report["steps"]:
        dup = str(s["duplicates"])
        steps.add_row(
            s["step"],
            str(s["attempts"]),
            str(s["sends"]),
            str(s["delivered"]),
            str(s["deduplicated"]),
            str(s["keys"]),
            str(s["max_per_key"]),
            str(s["unkeyed"]),
            f"[bold red]{dup}[/]" if s["duplicates"] else dup,
        )
    return steps


def _summary_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    k, rec = report["kills"], report["recovery"]
    summary = Table(show_header=False, title="summary")
    for label, value in (
        (
            "runs finished / failed / cancelled / lost",
            " / ".join(
                str(report.get(k, 0))
                for k in ("runs_finished", "runs_failed", "runs_cancelled", "runs_lost")
            )
            + f" of {report['runs']}",
        ),
        ("runs resumed (resumes)", f"{report['runs_resumed']} ({report['resumes']})"),
        (
            "kills at before_effect / after_effect / after_save",
            f"{k['before_effect']} / {k['after_effect']} / {k['after_save']}",
        ),
        (
            "random kills: pool child / whole worker",
            f"{k['random_pool_child']} / {k['whole_worker']}",
        ),
        ("recovery after a pool-child kill", _recovery_time(rec["pool_child"])),
        ("recovery after a whole-worker kill", _recovery_time(rec["whole_worker"])),
        ("slowest recoveries", _slowest(rec.get("slowest", []))),
        (
            "broker queue depth while running",
            f"p50 {report['queue_depth']['p50']} · max {report['queue_depth']['max']}",
        ),
        (
            "kills at before_call / after_call",
            f"{k.get('before_call', 0)} / {k.get('after_call', 0)}",
        ),
        (
            "model requests / journaled (+ in flight at a kill)",
            _model_row(report.get("model") or {}),
        ),
        ("duplicate deliveries", str(report["duplicates"])),
        *_record_rows(report),
        *_lifecycle_rows(report.get("lifecycle") or {}),
        *_replay_rows(report.get("replay_failed") or {}),
        *_deploy_rows(report),
        (
            "checkpoint history rows / violations",
            f"{report['history_rows']} / {report['history_violations']}",
        ),
        ("lease TTL", f"{report['lease_ttl']:g}s"),
        ("workers x processes", f"{report['workers']} x {report['concurrency']}"),
        ("seconds", str(report["seconds"])),
        ("replay", report["replay"]),
    ):
        summary.add_row(label, value)
    return summary


def _record_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    whole = report.get("pauses_whole_worker", 0)
    paused = f"{report.get('pauses', 0) - whole} / {whole} ({report.get('pauses_taken_over', 0)})"
    rows = [("pauses: pool child / whole worker (taken over)", paused)]
    if "graph" in report:
        rows.append(("graph threads / forks", f"{report['graph']['threads']} / {report['forks']}"))
    if "stream" in report:
        st = report["stream"]
        rows.append(
            (
                "streams checked / not as history / gone",
                f"{st['runs']} / {st['mismatches']} / {st['gone']} (after {st['waited']:g}s)",
            )
        )
        rows.append(
            ("late step_saved / attempts abandoned", f"{st['late_step_saved']} / {st['abandoned']}")
        )
    return rows


def _model_row(m: dict[str, Any]) -> str:
    if m.get("requests") is None:
        return "n/a"
    return f"{m['requests']} / {m['journaled']} (+ {m['in_flight_allowed']})"


def is_model_call(name: str) -> bool:
    """A journaled model request: ctx.model's, or a pydantic-ai agent's (its journal
    convention names them "<agent>__model.request", streaming or for another model)."""
    return name == "model" or "__model.request" in name


def _model_check(
    requests: int | None, journaled: dict[str, int], kills: list[dict[str, Any]]
) -> dict[str, Any]:
    """Model requests against the journal: each journaled call was asked once, and each
    kill may cut short at most one call in flight per run it held (a whole worker holds
    several). More than that is a call made again after its result was recorded."""
    allowed = sum(max(1, len(k.get("runs") or [])) for k in kills)
    recorded = sum(n for name, n in journaled.items() if is_model_call(name))
    if requests is None:
        return {"requests": None, "journaled": recorded, "in_flight_allowed": allowed, "excess": 0}
    return {
        "requests": requests,
        "journaled": recorded,
        "in_flight_allowed": allowed,
        "excess": max(0, requests - recorded - allowed),
    }


def _recovery_time(d: dict[str, Any]) -> str:
    if not d["n"]:
        return "n/a"
    return f"p50 {d['p50']:.2f}s · p95 {d['p95']:.2f}s · max {d['max']:.2f}s (n={d['n']})"


def _slowest(entries: list[dict[str, Any]]) -> str:
    return (
        "; ".join(
            f"{e['seconds']:.1f}s {e['run_id']} ("
            + (
                f"{e['kind'].replace('_', ' ')} killed during {e['cursor']}"
                if e["at"] == "outside"
                else f"killed at {e['at']} of {e['cursor']}"
            )
            + ")"
            for e in entries
        )
        or "n/a"
    )


def _lifecycle_rows(life: dict[str, Any]) -> list[tuple[str, str]]:
    if not life:
        return []
    return [
        (
            "signals sent (early / twice) / runs paid / lost",
            f"{life['signals_sent']} ({life['signals_early']} / {life['signals_duplicated']})"
            + f" / {life['runs_paid']} / {life['signals_lost']}",
        ),
        (
            "cancels asked / runs cancelled / sends after",
            f"{life['cancels_asked']} / {life['runs_cancelled']} / {life['sends_after_cancel']}",
        ),
    ]


def _replay_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    if not r:
        return []
    return [
        (
            "failed first / replayed / replayed again / re-armed once",
            f"{r['failed_first']} / {r['replayed']} / {r['replayed_again']} / {r['rearmed_once']}",
        )
    ]


def _deploy_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    d = report.get("deploy")
    if not d:
        return []
    old, new = d["old_version"], d["new_version"]
    swaps = "; ".join(
        f"{w['worker']} {w['how']}"
        + (f" holding {w['held']}" if w.get("held") is not None else "")
        + (f" (gone in {w['seconds_to_exit']}s)" if w.get("seconds_to_exit") is not None else "")
        + (f" -> {w['new_worker']}" if w.get("new_worker") else "")
        for w in d["swaps"]
    )
    reasons = "; ".join(f"{n}x {why}" for why, n in d["incompatible_reasons"].items())
    left = (report.get("keys") or {}).get("left") or {}
    return [
        ("deploy", f"{d['module']}: {old} -> {new}"),
        ("swaps", swaps or "none"),
        (
            f"runs started on {old} / {new}",
            f"{d['started'].get(old, 0)} / {d['started'].get(new, 0)}",
        ),
        (
            f"runs done by {old} / {new} (started on {old})",
            f"{d['finished'].get(old, 0)} / {d['finished'].get(new, 0)} ({d['crossed']})",
        ),
        ("runs stopped incompatible", f"{d['incompatible']}" + (f": {reasons}" if reasons else "")),
        (
            "stranded runs / leaked slots / duplicate effects",
            f"{report['runs_lost']} / {left.get('slots', 'n/a')} / {report['duplicates']}",
        ),
    ]
