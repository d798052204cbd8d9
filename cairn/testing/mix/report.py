"""How a mix's report prints: a summary table (seed, programs tried, operations, faults
landed, invariant checks), a table of what was found, and for each finding its shrunk
program as a pytest test and the command that replays it."""

from __future__ import annotations

from typing import Any


def verdict(report: dict[str, Any]) -> str:
    if report["ok"]:
        return "OK: no invariant broken"
    kinds = ", ".join(f["signature"] for f in report["findings"])
    return f"FAILED: {len(report['findings'])} invariant(s) broken ({kinds})"


def print_report(report: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = Console()
    summary = Table(title="cairn chaos mix", box=box.SQUARE, show_header=False)
    rows = [
        ("seed", str(report["seed"])),
        ("budget / seconds spent", f"{report['budget_s']:g} / {report.get('elapsed_s', 0):g}"
         + (f" (+ {report['shrinking_s']:g} shrinking)" if report.get("shrinking_s") else "")),
        ("programs tried / operations", f"{report['programs']} / {report['operations']}"),
        ("fault operations / faults landed", f"{report['fault_ops']} / {report['faults']}"),
        ("invariants / checks made", f"{len(report['invariants'])} / {report['checks']}"),
        ("invariants", ", ".join(report["invariants"])),
        ("seen, not judged", (f"{len(report.get('notes', []))} first tries that crossed a pause "
         "(sent on SIGCONT by a process stopped between its check and its send)")),
    ]  # fmt: skip
    for name, value in rows:
        summary.add_row(name, value)
    out.print(summary)
    if report["findings"]:
        found = Table(title="found", box=box.SQUARE)
        for col in ("invariant: kind", "after", "program", "shrunk to"):
            found.add_column(col)
        for f in report["findings"]:
            tries = (
                f" ({f['shrink_tries']} tries, {f['shrink_s']:g}s)" if "shrink_tries" in f else ""
            )
            found.add_row(
                f["signature"],
                f"{f['found_after_s']:g}s" if "found_after_s" in f else "-",
                f"{f.get('length', f['shrunk_length'])} ops",
                f"{f['shrunk_length']} ops{tries}",
            )
        out.print(found)
        for f in report["findings"]:
            out.print(f"\n[bold]{f['signature']}[/]: {f['detail']}", highlight=False)
            if "pytest" in f:
                out.print(
                    f"replay: cairn chaos mix --seed {report['seed']} --replay {f['file']}\n"
                    "or paste this test (tests/mix/ has the mix_fleet fixture):\n",
                    highlight=False,
                )
                print(f["pytest"])
    if report.get("outcomes"):
        for i, outcome in enumerate(report["outcomes"]):
            out.print(f"  op {i}: {outcome}", highlight=False)
    out.print(verdict(report), style="green" if report["ok"] else "red bold")
