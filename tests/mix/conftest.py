"""The mix's fleet, one per test session: every program of every mix test runs on it, each
under names of its own (cairn.testing.mix.rig)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.testing.mix.rig import MixFleet
from cairn.testing.mix.runner import fleet_options
from tests.helpers.mix import plain
from tests.helpers.services import BASE_DB


@pytest.fixture(scope="session")
def mix_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MixFleet]:
    from tests.conftest import _flushed_redis

    state: Path = tmp_path_factory.mktemp("mix")
    with _flushed_redis() as redis_url:
        options = fleet_options(database_url=BASE_DB, redis_url=redis_url, state_dir=state)
        fleet = MixFleet(options, say=plain)
        try:
            yield fleet.start()
        finally:
            fleet.close()
