"""Structured fields for cairn's log calls (procrastinate's `_log_extra`).

Every log call about a run passes `extra=logs.at(cp, "action")` (or `logs.run(run_id,
"action")` before a checkpoint is read), so run_id, cursor, seq, epoch and an action name
are attributes of the LogRecord, not words to find with a regex. `JsonFormatter`
(CAIRN_LOG_FORMAT=json) writes them, with the current span's trace and span ids, as one
JSON object a line; the message stays a sentence for a terminal.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint

try:  # the `otel` extra: without it, log lines carry no trace ids and cost nothing more
    from opentelemetry import trace as otel_trace
except ImportError:
    otel_trace = None  # type: ignore[assignment]

# The attributes every cairn log record carries (None where not known).
FIELDS = ("run_id", "cursor", "seq", "epoch", "action")
# Written first when a record has them; any other extra follows.
_LEADING = (*FIELDS, "workflow", "attempt", "worker")
# What every LogRecord has (3.12 adds taskName): the rest of its attributes are extras,
# but for uvicorn's color_message, the message again with terminal colours.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def at(cp: Checkpoint, action: str, **more: Any) -> dict[str, Any]:
    """extra= for a log call about the run at checkpoint cp."""
    return {
        "run_id": cp.run_id,
        "cursor": cp.cursor,
        "seq": cp.seq,
        "epoch": cp.epoch,
        "action": action,
        **more,
    }


def run(
    run_id: str | None, action: str, *, epoch: int | None = None, **more: Any
) -> dict[str, Any]:
    """extra= for a log call about a run whose checkpoint is not in hand (or no one run)."""
    return {"run_id": run_id, "cursor": None, "seq": None, "epoch": epoch, "action": action, **more}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts (ISO 8601, UTC), level, logger, message, the record's
    cairn fields and other extras (None left out), pid, the exception's text, and the
    trace_id and span_id of the OpenTelemetry span current where the call was made."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD and v is not None}
        for key in (*(k for k in _LEADING if k in extras), *extras):
            line.setdefault(key, extras[key])  # an extra never hides ts, level or message
        line["pid"] = record.process
        if record.exc_info:
            # Cached on the record, as logging.Formatter does, for the next handler.
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        if otel_trace is not None:
            ctx = otel_trace.get_current_span().get_span_context()
            if ctx.is_valid:
                line["trace_id"] = format(ctx.trace_id, "032x")
                line["span_id"] = format(ctx.span_id, "016x")
        try:
            return json.dumps(line, default=str)
        except (TypeError, ValueError):  # a dict with non-string keys, a cycle: say it anyway
            return json.dumps({k: v if _plain(v) else str(v) for k, v in line.items()})


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def use_json(logger: logging.Logger, **_: Any) -> None:
    """Give each of logger's handlers the JSON formatter: a receiver of Celery's
    after_setup_logger and after_setup_task_logger, which install handlers of their own."""
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())


class JsonLines(io.TextIOBase):
    """A text stream that writes each line given it as a JSON log line (logger `name`,
    level INFO) to file descriptor fd: for what a library prints where only JSON lines
    may go. With os.write and no lock, as it may be written from a signal handler."""

    def __init__(self, fd: int, name: str) -> None:
        self._fd, self._name, self._part = fd, name, ""
        self._format = JsonFormatter().format

    def writable(self) -> bool:
        return True

    def fileno(self) -> Any:
        # None: a caller that would write to the descriptor itself, text and all
        # (Celery's safe_say, from its signal handlers), writes nothing.
        return None

    def write(self, text: str) -> int:
        *lines, self._part = (self._part + text).split("\n")
        for line in lines:
            if line.strip():
                record = logging.makeLogRecord(
                    {"name": self._name, "msg": line, "levelno": logging.INFO, "levelname": "INFO"}
                )
                data = (self._format(record) + "\n").encode()
                while data:
                    data = data[os.write(self._fd, data) :]
        return len(text)


def run_trace(run_id: str) -> tuple[int, int]:
    """(trace id, span id) of the trace of a run enqueued without tracing (a scheduled
    tick): derived from its run id, so every delivery of it, traced, shares one trace."""
    digest = hashlib.sha256(run_id.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a W3C traceparent ("00-<trace id>-<span id>-<flags>"), or
    None for None, a malformed value, or the all-zero (invalid) trace id."""
    found = _TRACEPARENT.fullmatch(traceparent or "")
    if found is None or found.group(1) == "0" * 32:
        return None
    return found.group(1)
