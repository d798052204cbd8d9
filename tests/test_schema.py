"""The database agrees with the code where both name the same facts."""

from __future__ import annotations

import re

from cairn.status import RunStatus


def test_the_status_check_constraint_lists_exactly_the_run_statuses(sql) -> None:
    ((definition,),) = sql(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conname = 'checkpoints_status_check'"
    )
    assert set(re.findall(r"'(\w+)'::text", definition)) == {s.value for s in RunStatus}
