"""`cairn chaos mix`: programs of operations over the public surface, with faults mixed
in, on one real fleet, checked against invariants read from outside records; a failing
program is shrunk and printed as a pytest test (docs/guides/chaos.md).

The package, one concern a module: program (what a program is, its names, its pytest
form), generate (programs from a seed), flows (the mix's workflows), rig (the fleet),
standins (the model and mail stand-ins with request logs and traps), surfaces (an
operation through the Client, the AsyncClient or HTTP), faults (kills, pauses, 429s),
execute (a program on the fleet, into a World), world (what it was told), check (the
invariants), shrink (a failing program made small), runner (run_mix, check_program) and
report (how a mix prints). Importing it stays cheap: the heavy imports wait until a mix
runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.testing.mix.program import Program


def check_program(program: Program, **options: Any) -> None:
    """Run one mix program on a fleet and fail (AssertionError) as it broke an invariant
    (cairn.testing.mix.runner.check_program)."""
    from cairn.testing.mix.runner import check_program as run

    run(program, **options)


def mix_fleet_fixture(**options: Any) -> Any:
    """A session-scoped pytest fixture that starts the mix's fleet once (options: those of
    cairn.testing.mix.runner.fleet_options, e.g. workflows="mypkg.flows"), for the tests
    `cairn chaos mix` prints: `mix_fleet = mix_fleet_fixture()` in a conftest.py."""
    import pytest

    @pytest.fixture(scope="session")
    def mix_fleet() -> Any:
        from cairn.testing.mix.rig import MixFleet
        from cairn.testing.mix.runner import fleet_options

        fleet = MixFleet(fleet_options(**options))
        try:
            yield fleet.start()
        finally:
            fleet.close()

    return mix_fleet


__all__ = ["check_program", "mix_fleet_fixture"]
