"""Each way a delivery ends without ending its run is handled by the run task by kind,
without Celery: a stand-in task records what the real one would ask Celery for."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from cairn.core import errors, logs
from cairn.core.settings import Settings
from cairn.workers import loop
from cairn.workers.app import run_task

SETTINGS = Settings(defer_seconds=2.0, transient_retries=3)


class RateLimited(errors.Interrupted):
    """A kind of Interrupted the task has no branch for (the flow issue will add one)."""


class Again(Exception):
    def __init__(self, countdown: float, queue: str) -> None:
        self.countdown, self.queue = countdown, queue


@dataclasses.dataclass
class Leases:
    """acquire() raises what the test says: the loop lets every Interrupted through."""

    raises: BaseException

    def acquire(self, run_id: str, ttl: float, floor: int = 0) -> Any:
        raise self.raises


@dataclasses.dataclass
class Task:
    """What run_task reads of a bound Celery task."""

    app: Any
    retries: int = 0
    sent: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)

    @property
    def request(self) -> Any:
        return type("Request", (), {"retries": self.retries})()

    def retry(self, countdown: float, queue: str) -> Exception:
        return Again(countdown, queue)

    def apply_async(self, args: tuple[Any, ...], queue: str) -> None:
        self.sent.append((args, queue))


def task_raising(exc: BaseException, retries: int = 0) -> Task:
    deps = loop.Deps(settings=SETTINGS, store=None, leases=Leases(exc), model=None)  # type: ignore[arg-type]
    task = Task(app=None, retries=retries)

    # The Runtime's send path, as a run never pinned takes it (routes: tests/integration).
    def queue(self: Any, run_id: str, resume: bool, priority: int = 0) -> str:
        return "cairn.resume" if resume else "celery"

    def send(self: Any, run_id: str, resume: bool = True, priority: int = 0) -> None:
        task.apply_async((run_id,), queue=queue(self, run_id, resume, priority))

    runtime = type(
        "Runtime",
        (),
        {"settings": SETTINGS, "deps": lambda self: deps, "queue": queue, "send": send},
    )()
    task.app = type("App", (), {"cairn": runtime})()
    return task


def test_deferred_and_retry_later_come_back_after_their_delay() -> None:
    with pytest.raises(Again) as deferred:
        run_task(task_raising(errors.Deferred("r", "h:1:n|2")), "r")
    assert (deferred.value.countdown, deferred.value.queue) == (2.0, "cairn.resume")
    with pytest.raises(Again) as later:
        run_task(task_raising(errors.RetryLater("r", 7.5)), "r")
    assert later.value.countdown == 7.5


def test_a_hand_off_is_sent_again_and_a_superseded_run_is_left_alone() -> None:
    task = task_raising(errors.HandOff("stopping"))
    assert run_task(task, "r") == "handed_off" and task.sent == [(("r",), "cairn.resume")]
    task = task_raising(errors.LeaseLost("r", "expired"))
    assert run_task(task, "r") == "lost" and task.sent == []


def test_a_kind_without_a_branch_is_retried_with_backoff_and_bounded() -> None:
    with pytest.raises(Again) as first:
        run_task(task_raising(RateLimited("slow down")), "r")
    with pytest.raises(Again) as third:
        run_task(task_raising(RateLimited("slow down"), retries=2), "r")
    assert first.value.countdown == 2.0 and third.value.countdown == 8.0
    with pytest.raises(RateLimited):  # CAIRN_TRANSIENT_RETRIES spent: the task fails
        run_task(task_raising(RateLimited("slow down"), retries=3), "r")


def test_the_tasks_log_records_carry_the_run_fields(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="cairn.workers.app"), pytest.raises(Again):
        run_task(task_raising(errors.StoreUnavailable("postgres down")), "run-7")
    (record,) = caplog.records
    assert {f: getattr(record, f) for f in logs.FIELDS} == {
        "run_id": "run-7",
        "cursor": None,
        "seq": None,
        "epoch": None,
        "action": "transient",
    }
