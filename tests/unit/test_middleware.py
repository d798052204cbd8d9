"""The middleware chain: ordered, each hook guarded, only overridden hooks called."""

from __future__ import annotations

import logging

import pytest

from cairn.core import errors
from cairn.store import Checkpoint
from cairn.workers import metrics
from cairn.workers.middleware import Chain, Middleware, load

CP = Checkpoint(
    run_id="r",
    workflow="w",
    input={},
    seq=3,
    cursor="two",
    state={},
    visits={},
    window=(),
    win_start=0,
    cost_usd=0.5,
)


class Recorder(Middleware):
    def __init__(self, name: str, calls: list[tuple[str, ...]]) -> None:
        self.name, self.calls = name, calls

    def before_step(self, cp: Checkpoint) -> None:
        self.calls.append((self.name, "before_step", cp.cursor))

    def after_step(self, cp, *, saved, exception, seconds) -> None:  # type: ignore[no-untyped-def]
        outcome = "saved" if saved is not None else type(exception).__name__
        self.calls.append((self.name, "after_step", outcome))
        assert seconds >= 0

    def after_run(self, run_id, *, status, exception) -> None:  # type: ignore[no-untyped-def]
        self.calls.append((self.name, "after_run", str(status or type(exception).__name__)))


class Broken(Middleware):
    def before_step(self, cp: Checkpoint) -> None:
        raise RuntimeError("tracer down")


def test_hooks_run_in_order_and_a_failing_one_is_logged_not_raised(caplog) -> None:
    calls: list[tuple[str, ...]] = []
    chain = Chain([Recorder("a", calls), Broken(), Recorder("b", calls)])
    with caplog.at_level(logging.ERROR, logger="cairn.workers.middleware"):
        chain.before_step(CP)
    assert calls == [("a", "before_step", "two"), ("b", "before_step", "two")]
    (record,) = caplog.records
    assert "Broken.before_step" in record.getMessage() and record.action == "middleware_failed"
    assert record.exc_info and "tracer down" in str(record.exc_info[1])


def test_after_step_and_after_run_receive_the_outcome() -> None:
    calls: list[tuple[str, ...]] = []
    chain = Chain([Recorder("a", calls)])
    chain.after_step(CP, 0.0, saved=CP)
    chain.after_step(CP, 0.0, exception=errors.RetryLater("r", 2.0))
    chain.after_run("r", status="done")
    chain.after_run("r", exception=errors.Deferred("r", "host:1:x|4"))
    assert calls == [
        ("a", "after_step", "saved"),
        ("a", "after_step", "RetryLater"),
        ("a", "after_run", "done"),
        ("a", "after_run", "Deferred"),
    ]


def test_only_overridden_hooks_are_called() -> None:
    chain = Chain([Middleware(), Recorder("a", [])])
    assert chain._calls["before_run"] == [] and len(chain._calls["before_step"]) == 1


def test_a_delivery_outcome_is_named_by_its_kind() -> None:
    assert metrics.outcome("done", None) == "done"
    assert metrics.outcome(None, errors.Deferred("r", None)) == "deferred"
    assert metrics.outcome(None, errors.StoreUnavailable("down")) == "retry"
    assert metrics.outcome(None, errors.HandOff("stopping")) == "handed_off"
    assert metrics.outcome(None, errors.LeaseLost("r", "expired")) == "lost"
    assert metrics.outcome(None, errors.UnknownRun("r")) == "error"


def test_cairn_middleware_names_importable_middleware_subclasses() -> None:
    (made,) = load(["cairn.workers.metrics:Metrics"])
    assert isinstance(made, metrics.Metrics)
    with pytest.raises(ValueError, match="module:Class"):
        load(["no_such_module_x:Thing"])
    with pytest.raises(TypeError, match="not a cairn Middleware"):
        load(["cairn.core.settings:Settings"])
