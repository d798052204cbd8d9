"""The chaos mix's parts that need no process: programs from a seed, their names, their
pytest form, and the shrinker (against a replay that is a plain function)."""

from __future__ import annotations

import ast
import random

from cairn.testing.mix.generate import Generator
from cairn.testing.mix.program import Names, as_pytest, refs
from cairn.testing.mix.shrink import shrink, sliced
from cairn.testing.mix.world import World


def test_the_same_seed_makes_the_same_programs_and_another_seed_others() -> None:
    def programs(seed: int) -> list[list[dict]]:
        gen = Generator(random.Random(seed))
        return [gen.program() for _ in range(5)]

    assert programs(7) == programs(7)
    assert programs(7) != programs(8)


def test_a_program_acts_only_on_runs_it_made_and_puts_faults_before_their_enqueue() -> None:
    gen = Generator(random.Random(3))
    for _ in range(50):
        program = gen.program()
        made: set[str] = set()
        for i, op in enumerate(program):
            if op["op"] in ("model_429_pause", "kill_at"):
                # armed for the enqueue that follows it
                assert program[i + 1]["op"] == "enqueue" and program[i + 1]["run"] == op["run"]
                continue
            if op["op"] in ("enqueue", "enqueue_tx", "debounce"):
                made.add(op["run"])
            elif op.get("run") is not None:
                assert op["run"] in made, (i, op, program)
            if op["op"] == "fork":
                made.add(op["new"])


def test_names_fill_markers_and_nest_deep_values_per_execution() -> None:
    names = Names("m7x2")
    assert names.run("r1") == "m7x2-r1" and names.tenant("t1") == "m7x2t1"
    assert names.tenant(None) is None
    filled = names.fill({"data": {"@deep": 3, "leaf": "@mk1"}, "tags": ["@mk2"]})
    assert filled == {"data": {"a": {"a": {"a": "m7x2mk1"}}}, "tags": ["m7x2mk2"]}
    assert names.mark in filled["tags"][0] and names.run("r1") not in names.mark


def test_a_finding_prints_as_a_pytest_test_of_python_literals() -> None:
    program = [{"op": "enqueue", "run": "r1", "flow": "mix_model", "input": {"x": None, "y": True}}]
    text = as_pytest(program, seed=42, found='a """quoted""" thing \\ here')
    tree = ast.parse(text)
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert fn.name == "test_mix_seed_42"
    [assign] = [n for n in fn.body if isinstance(n, ast.Assign)]
    assert ast.literal_eval(assign.value) == program


def test_the_slice_keeps_what_the_names_need_and_the_operations_on_no_name() -> None:
    program = [
        {"op": "enqueue", "run": "r1"},
        {"op": "enqueue", "run": "r2"},
        {"op": "fork", "run": "r1", "new": "r3"},
        {"op": "model_fail", "status": 503},
        {"op": "read", "run": "r3", "as": "t1"},
        {"op": "schedule", "action": "list", "as": "t2"},
    ]
    assert sliced(program, {"r3"}) == [program[0], program[2], program[3], program[4]]
    assert refs(program[4]) == {"r3", "t1"}


def test_shrink_finds_the_operations_a_failure_needs() -> None:
    # The "bug": a rolled-back enqueue of r2 after a schedule is added, whatever else.
    program = [{"op": "enqueue", "run": f"r{i}"} for i in range(6)]
    program[2] = {"op": "schedule_add", "schedule": "s1"}
    program[4] = {"op": "enqueue_tx", "run": "r2", "end": "rollback"}
    needed = [program[2], program[4]]

    def replay(candidate: list[dict]) -> World:
        world = World(names=Names("x"), started=None)  # type: ignore[arg-type]
        world.outcomes = ["ok"] * len(candidate)
        if all(op in candidate for op in needed):
            world.violate("readback", "enqueue_tx:rolled_back", "it exists", "r2")
        return world

    shrunk, tries = shrink(
        program, "readback:enqueue_tx:rolled_back", {"r2"}, replay, 60, say=lambda s: None
    )
    assert shrunk == needed
    assert tries <= 2 * len(program)


def test_on_a_users_workflows_the_programs_use_their_input_and_the_operations_any_run_takes() -> (
    None
):
    gen = Generator(random.Random(5), ("summarize",), template={"text": "note {i}", "n": 2})
    kinds: set[str] = set()
    for _ in range(40):
        for op in gen.program():
            kinds.add(op["op"])
            if op["op"] in ("enqueue", "enqueue_tx", "debounce"):
                assert op["flow"] == "summarize"
                assert op["input"]["n"] == 2 and op["input"]["text"].startswith("note @mk")
            if op["op"] == "fork":
                assert op["patch"]["text"].startswith("note @mk")
    assert not kinds & {"signal", "steer", "decide", "resolve"}  # the mix's own flows only
    assert {"enqueue", "fork", "cancel", "kill_at", "model_429_pause"} <= kinds
