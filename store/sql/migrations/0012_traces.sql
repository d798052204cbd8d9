-- Traces (CAIRN_TRACING, cairn.otel): the W3C traceparent of the span that enqueued the
-- run (a web request's, a spawning step's), so each delivery of the run, on whatever
-- worker, after whatever kill, continues that one trace.
ALTER TABLE runs ADD COLUMN traceparent text;
-- And of the span that sent a signal: the step it wakes links to it (another trace).
ALTER TABLE signals ADD COLUMN traceparent text;
