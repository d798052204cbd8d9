"""A run's step timeline as `cairn runs show` prints it: a table when it fits the terminal
whole, else (an 80-column terminal) one block per step, labelled as the run's own fields
are. A table squeezed to fit shows nothing whole: every column five characters wide."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from cairn.core.records import StepRecord

KEY_MIN = 24  # the narrowest the effect key / error column may fold to in the table
COLOURS = {"saved": "green", "retry": "yellow"}  # any other outcome stopped the run: red
COLUMNS = ("seq", "step", "visit", "outcome", "started", "seconds", "worker", "version", "cost $")
KEY = "effect key / error"
RIGHT = ("seq", "visit", "seconds", "cost $")
STAMP = "%Y-%m-%d %H:%M:%S.%f"  # to the millisecond: [:-3]


def print_timeline(console: Console, steps: list[StepRecord]) -> None:
    """The steps' table if it fits console.width with every column whole (the effect key
    or error folded, no narrower than KEY_MIN); else the steps one under the other."""
    if not steps:
        return
    days = {s.started_at.date() for s in steps}
    rows = _rows(steps, with_date=len(days) > 1)
    # A column with nothing to say in any step is left out: room for the others.
    drop = {"version"} if not any(s.code_version for s in steps) else set()
    drop |= {"cost $"} if not any(s.cost_usd for s in steps) else set()
    shown = [i for i, name in enumerate(COLUMNS) if name not in drop]
    heads = [COLUMNS[i] for i in shown]
    if len(days) == 1:  # the day once, in the header
        heads[heads.index("started")] = f"started {days.pop().isoformat()}"
    keys = [s.error or s.effect_key or "" for s in steps]
    table = Table(box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    for head in heads:
        table.add_column(head, no_wrap=True, justify="right" if head in RIGHT else "left")
    if any(keys):
        table.add_column(KEY, overflow="fold")
    for row, key in zip(rows, keys, strict=True):
        table.add_row(*(row[i] for i in shown), *([escape(key)] if any(keys) else []))
    # Measured unbounded: measure() within console.width is clamped to it.
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    folded = max(len(KEY), *(len(k) for k in keys)) - KEY_MIN if any(keys) else 0
    if natural - max(folded, 0) <= console.width:
        console.print(table)
    else:
        _print_blocks(console, steps, rows, keys)


def _rows(steps: list[StepRecord], *, with_date: bool) -> list[list[str]]:
    """Each step's cells, in COLUMNS order, as markup (a new owner's worker in bold)."""
    stamp = STAMP if with_date else STAMP.split(" ")[1]
    out, previous = [], None
    for s in steps:
        colour = COLOURS.get(s.outcome, "red")
        worker = escape(s.worker or "")
        # A new owner (a resume after a kill, a hand-off) shows as the worker changing.
        moved = previous is not None and s.worker != previous
        previous = s.worker
        out.append(
            [
                str(s.seq),
                escape(s.cursor),
                str(s.visit),
                f"[{colour}]{s.outcome}[/]",
                s.started_at.strftime(stamp)[:-3],
                f"{s.seconds:.3f}",
                f"[bold]{worker}[/]" if moved else worker,
                escape(s.code_version or ""),
                f"{s.cost_usd:.6f}",
            ]
        )
    return out


def _print_blocks(
    console: Console, steps: list[StepRecord], rows: list[list[str]], keys: list[str]
) -> None:
    """One block per step, its fields labelled down the left (as `_print_row` prints the
    run's), long values folded under themselves."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", no_wrap=True, style="bold", min_width=10)
    grid.add_column(overflow="fold")
    for n, (s, row, key) in enumerate(zip(steps, rows, keys, strict=True)):
        seq, step, visit, outcome, _, seconds, worker, version, cost = row
        if n:
            grid.add_row("", "")  # a blank line between steps
        grid.add_row(f"seq {seq}", f"{step} · visit {visit} · {outcome}")
        grid.add_row("started", f"{s.started_at.strftime(STAMP)[:-3]} · {seconds} s")
        if worker:
            grid.add_row("worker", worker)
        if version:
            grid.add_row("version", version)
        if s.cost_usd:
            grid.add_row("cost $", cost)
        if key:
            grid.add_row("error" if s.error else "effect key", escape(key))
    console.print(grid)
