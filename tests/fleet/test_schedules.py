"""Two `cairn beat`s and a real worker: an every-second schedule fires once per tick."""

from __future__ import annotations

from pathlib import Path

from cairn.client.client import Client
from cairn.testing import fleet
from cairn.testing.standins import MailServer
from tests.helpers.runs import wait_for
from tests.helpers.schedules import contiguous, fired


def test_two_beats_fire_an_every_second_schedule_once_per_tick(
    settings, client: Client, sql, worker_env, mail: MailServer, tmp_path: Path
) -> None:
    """`celery beat` twice (the cairn app, as `cairn beat` runs it) and a worker of two
    processes: the runs' ids are consecutive seconds, each run ran and mailed once."""
    # Booted side by side: each takes seconds to import the app.
    worker = fleet.spawn_worker(worker_env, tmp_path / "w.log", "w", 2)
    debug = {**worker_env, "CAIRN_LOGLEVEL": "DEBUG"}  # beat's passes are DEBUG lines
    beats = [
        fleet.start_beat(debug, tmp_path / f"beat{i}.log", tmp_path / f"beat{i}-schedule")
        for i in range(2)
    ]
    procs = [worker, *beats]
    fleet.wait_ready(worker)
    for beat in beats:
        wait_for(lambda b=beat: "control: schedules pass" in b.text(), 60, "beat to tick")
    try:
        client.add_schedule("pulse", "loop", {"visits": 1}, every=1)
        wait_for(lambda: len(fired(sql, "pulse")) >= 6, 30, "six ticks")
        client.pause_schedule("pulse")
        for beat in beats:
            beat.kill()
        ids = fired(sql, "pulse")
        for rid in ids:
            run = client.wait(rid, timeout=30)
            assert run.status == "done", (rid, run.error)
    finally:
        for proc in procs:
            proc.kill()
    for beat in beats:
        assert beat.text().count("control: schedules pass") >= 4, beat.text()
    assert contiguous(ids), ids
    stats = mail.stats()
    assert stats["deliveries"] == len(ids) and stats["duplicate_deliveries"] == 0
