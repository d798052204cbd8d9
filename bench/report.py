"""Rich tables and the pass/fail target lines (ratios within one run)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _f(v: Any, fmt: str = "{:,.0f}") -> str:
    if v is None:
        return "–"
    return fmt.format(v)


def _kb(w: Any) -> str:
    return f"{w // 1024} KB" if isinstance(w, int) else "–"


def _rows(results: dict[str, Any], section: str) -> list[dict[str, Any]]:
    sec = results.get(section) or {}
    return list(sec.get("rows", [])) if isinstance(sec, dict) else []


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in rows:
        if "skipped" not in r and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(name: str, ok: bool | None, detail: str) -> None:
        out.append({"target": name, "pass": ok, "detail": detail})

    per = _rows(results, "per_step")
    if per:
        tiny = _find(per, key="tiny")
        cairn, celery = (_find(per, key=k, window_bytes=4096) for k in ("cairn", "celery"))
        for row, what, bound in (
            (cairn, "cairn in-process per-step cost", 1.2),
            (celery, "cairn through Celery", 1.4),
        ):
            if tiny and row:
                x = row["time_vs_floor"]
                add(
                    f"{what} ≤ {bound}× tiny floor (W=4 KB)",
                    x <= bound,
                    f"best of reps {row['best_ms_per_step']:.3f} ms vs tiny floor "
                    f"{tiny['best_ms_per_step']:.3f} ms = {x:.2f}× (medians "
                    f"{row['ms_per_step']:.3f} / {tiny['ms_per_step']:.3f}; paired "
                    f"{_f(row.get('paired_ratio'), '{:.2f}×')}; whole-window floor "
                    f"{_f(row.get('time_vs_window_floor'), '{:.2f}×')})",
                )

    run = results.get("per_run") or {}
    if isinstance(run, dict) and run.get("ratio"):
        x = run["ratio"]
        add(
            "per-run fixed cost ≤ 2× a Celery no-op task's (1-step runs, same worker)",
            x <= 2.0,
            f"{run['run_ms']:.2f} vs {run['noop_ms']:.2f} ms each = {x:.2f}× "
            f"(best of {run['reps']} batches of {run['runs']}; paired "
            f"{_f(run.get('paired_ratio'), '{:.2f}×')})",
        )

    grow = _rows(results, "growth")
    cairn_rows = sorted(
        (r for r in grow if r.get("key") == "cairn" and "skipped" not in r), key=lambda r: r["n"]
    )
    if len(cairn_rows) >= 2:
        lo, hi = cairn_rows[0], cairn_rows[-1]
        x = hi["wal_bytes_per_step"] / lo["wal_bytes_per_step"]
        add(
            f"cairn WAL bytes/step flat in N (N={hi['n']} ≤ 1.2× N={lo['n']})",
            x <= 1.2,
            f"{hi['wal_bytes_per_step']:,.0f} vs {lo['wal_bytes_per_step']:,.0f} B/step = {x:.2f}×",
        )
    dbos_rows = {r["n"]: r for r in grow if r.get("key") == "dbos" and "skipped" not in r}
    if cairn_rows and dbos_rows:
        pairs = [(c, dbos_rows[c["n"]]) for c in cairn_rows if c["n"] in dbos_rows]
        ok = all(c["wal_bytes_per_step"] <= d["wal_bytes_per_step"] for c, d in pairs)
        add(
            "cairn WAL bytes/step ≤ DBOS's (1 KB messages)",
            ok,
            "; ".join(
                f"N={c['n']}: {c['wal_bytes_per_step']:,.0f} vs {d['wal_bytes_per_step']:,.0f}"
                for c, d in pairs
            ),
        )
    elif cairn_rows:
        skipped = next((r for r in grow if r.get("key") == "dbos"), None)
        add(
            "cairn WAL bytes/step ≤ DBOS's (1 KB messages)",
            None,
            f"not compared: DBOS {skipped.get('skipped') if skipped else 'missing'}",
        )

    fl = _rows(results, "fleet")
    for r in fl:
        if r.get("pgbench_tps"):
            x = r["steps_vs_pgbench"]
            add(
                f"fleet steps/s with {r['workers']} worker(s) ≥ 40% of pgbench at {r['workers']} client(s)",
                x >= 0.4,
                f"{r['steps_per_s']:,.0f} vs {r['pgbench_tps']:,.0f} tps = {100 * x:.0f}%",
            )

    rec = results.get("recovery") or {}
    for m in rec.get("modes", []) if isinstance(rec, dict) else []:
        bound = rec["lease_ttl"] + 2
        add(
            f"recovery p95 ≤ lease TTL + 2 s ({m['label']}, TTL {rec['lease_ttl']:g} s)",
            m["p95"] <= bound,
            f"p50 {m['p50']:.2f} s, p95 {m['p95']:.2f} s over {len(m['seconds'])} kills",
        )
    return out


def render(results: dict[str, Any], console: Console | None = None) -> None:
    c = console or Console(width=160)
    per = _rows(results, "per_step")
    if per:
        sec = results["per_step"]
        t = Table(
            title=f"1. Per-step overhead: N={sec['steps']} no-op steps; ms/step = median of "
            f"{sec['reps']}; × floor (the tiny guarded upsert) and × W floor (whole window) "
            "from the best of each; paired × = median of each rep over its neighbour tiny "
            "floor; WAL = min"
        )
        for col in (
            "system",
            "window",
            "steps/s",
            "ms/step",
            "best ms",
            "× floor",
            "paired ×",
            "× W floor",
            "WAL B/step",
            "WAL × floor",
        ):
            t.add_column(col, justify="left" if col == "system" else "right")
        for r in per:
            if "skipped" in r:
                t.add_row(r["system"], "", "", "", "", "", "", "", "", f"[yellow]{r['skipped']}[/]")
                continue
            t.add_row(
                r["system"],
                _kb(r.get("window_bytes")),
                _f(r["steps_per_s"]),
                _f(r["ms_per_step"], "{:.3f}"),
                _f(r.get("best_ms_per_step"), "{:.3f}"),
                _f(r.get("time_vs_floor"), "{:.2f}×"),
                _f(r.get("paired_ratio"), "{:.2f}×"),
                _f(r.get("time_vs_window_floor"), "{:.2f}×"),
                _f(r["wal_bytes_per_step"]),
                _f(r.get("wal_vs_floor"), "{:.2f}×"),
            )
        c.print(t)
    grow = _rows(results, "growth")
    if grow:
        sec = results["growth"]
        t = Table(title=f"2. Growth: one {sec['msg_bytes']} B message per step")
        for col in ("system", "N", "seconds", "steps/s", "WAL total", "WAL B/step"):
            t.add_column(col, justify="left" if col == "system" else "right")
        for r in grow:
            if "skipped" in r:
                t.add_row(r["system"], "", "", "", "", f"[yellow]{r['skipped']}[/]")
                continue
            t.add_row(
                r["system"],
                str(r["n"]),
                _f(r["seconds"], "{:.2f}"),
                _f(r["steps_per_s"]),
                _f(r["wal_bytes"]),
                _f(r["wal_bytes_per_step"]),
            )
        c.print(t)
        c.print(f"[dim]{sec.get('note', '')}[/]")
    rec = results.get("recovery")
    if isinstance(rec, dict) and rec.get("modes"):
        t = Table(
            title=f"3. Recovery: SIGKILL → next saved checkpoint elsewhere (CAIRN_LEASE_TTL={rec['lease_ttl']:g}s)"
        )
        for col in ("kill", "kills", "p50 s", "p95 s", "max s", "bound s"):
            t.add_column(col, justify="left" if col == "kill" else "right")
        for m in rec["modes"]:
            t.add_row(
                m["label"],
                str(len(m["seconds"])),
                _f(m["p50"], "{:.2f}"),
                _f(m["p95"], "{:.2f}"),
                _f(m["max"], "{:.2f}"),
                _f(rec["lease_ttl"] + 2, "{:.1f}"),
            )
        c.print(t)
    fl = _rows(results, "fleet")
    if fl:
        t = Table(
            title=f"4. Fleet: runs of {fl[0]['steps_per_run']} no-op steps, concurrency-1 workers"
        )
        for col in (
            "workers",
            "runs/s",
            "steps/s",
            "celery no-op tasks/s",
            "runs/s ÷ no-op",
            "pgbench upsert tps",
            "steps ÷ pgbench",
        ):
            t.add_column(col, justify="right")
        for r in fl:
            t.add_row(
                str(r["workers"]),
                _f(r["runs_per_s"], "{:,.1f}"),
                _f(r["steps_per_s"]),
                _f(r["noop_tasks_per_s"]),
                _f(r["runs_vs_noop"], "{:.2f}"),
                _f(r["pgbench_tps"]) if r["pgbench_tps"] else str(r["pgbench_note"]),
                _f(r["steps_vs_pgbench"], "{:.0%}"),
            )
        c.print(t)
    run = results.get("per_run")
    if isinstance(run, dict) and run.get("rows"):
        t = Table(
            title=f"5. Per-run fixed cost: batches of {run['runs']} one-step runs vs Celery "
            f"no-op tasks on one concurrency-1 worker; best of {run['reps']}"
        )
        for col in ("what", "ms each", "× no-op"):
            t.add_column(col, justify="left" if col == "what" else "right")
        for r in run["rows"]:
            t.add_row(r["what"], _f(r["ms"], "{:.3f}"), _f(r.get("vs_noop"), "{:.2f}×"))
        c.print(t)
    for name in ("per_step", "growth", "recovery", "fleet", "per_run"):
        sec = results.get(name)
        if isinstance(sec, dict) and "error" in sec:
            c.print(f"[red]{name}: {sec['error']}[/]")
    for w in results.get("meta", {}).get("warnings", []):
        c.print(f"[yellow]warning: {w}[/]")
    tg = results.get("targets", [])
    if tg:
        c.print("[bold]Targets[/] (printed, never fatal)")
        for t_ in tg:
            mark = {True: "[green]PASS[/]", False: "[red]MISS[/]", None: "[yellow]SKIP[/]"}[
                t_["pass"]
            ]
            c.print(f"  {mark}  {t_['target']}: {t_['detail']}")
