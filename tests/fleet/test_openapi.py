"""The HTTP API's reference is its OpenAPI document: schemathesis, with every check and
every phase (examples, coverage, fuzzing, stateful), run against a real `cairn serve` on
loopback, finds nothing the document does not say: no server error, no undocumented
status, content type or header, no request the document calls valid refused, and none it
calls invalid accepted. The document itself is pinned: tests/integration/test_openapi.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cairn.client.client import Client
from cairn.core.status import RunStatus
from tests.helpers.runs import Server

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
# Test cases per operation in each generating phase (the coverage phase adds one per rule
# of the document). About 25 operations: the run takes ~40 s on a 2-core machine.
MAX_EXAMPLES = 100
POSITIVE = '["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"'
# Where a request the document calls valid may still be refused with 422: rules that are
# the server's state or code, which no JSON Schema can state. The document says each one
# in the operation's 422 description; everything else about these operations is checked.
CONFIG = f"""
# A workflow's input is checked by the workflow's own code (and the server's size and NUL
# rules); run_id and Idempotency-Key must be equal when both are sent: a rule across the
# header and the body, which OpenAPI cannot state.
[[operations]]
include-path = "/runs"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = {POSITIVE}, "422"]

[[operations]]
include-path = "/schedules"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = {POSITIVE}, "422"]

# at_seq / to_seq must be a seq the run saved: its history, not a schema.
[[operations]]
include-path-regex = "^/runs/\\\\{{run_id\\\\}}/(fork|rewind)$"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = {POSITIVE}, "422"]

# args come with an edit and with nothing else: a rule across two fields of the body.
[[operations]]
include-path = "/approvals/{{approval_id}}/decision"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = {POSITIVE}, "422"]

# schemathesis 4.32's coverage phase sends `Last-Event-ID: 0` as valid: its header values
# keep to letters and digits, so none matches the id pattern (which has a "-").
[[operations]]
include-path = "/runs/{{run_id}}/events"
include-method = "GET"
checks.positive_data_acceptance.expected-statuses = {POSITIVE}, "422"]
"""


def test_the_api_does_what_its_openapi_document_says(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    # No workflow registered: a run it started would be a run no one runs, and the events
    # of a live run are a stream that never ends (a read timeout). Its broker is this
    # test's Redis database: what it enqueues, no one runs.
    server = serve(CAIRN_WORKFLOWS="")
    # One worker: two threads of the coverage phase ast.parse at once (hypothesis naming
    # a filter), which CPython 3.11 can fail with "AST constructor recursion depth
    # mismatch", a schemathesis runtime error that fails the run (typed answers made it
    # happen every run; ~20 s more).
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    cmd = [
        SCHEMATHESIS, "--no-color", "--config-file", str(config),
        "run", f"{server.url}/openapi.json",
        "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", str(MAX_EXAMPLES), "--seed", "30", "--generation-database", "none",
        "--header", f"Authorization: Bearer {server.token}",
        "--request-timeout", "10", "--workers", "1", "--output-truncate", "false",
    ]  # fmt: skip
    out = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout[-30000:] + out.stderr[-3000:]


# The statuses of each request example, sent as the document gives it: accepted, each
# run-path one about a run that is done (so none is a 404 that never read the body).
TAKEN = {
    ("post", "/runs"): 202,
    ("post", "/schedules"): 201,
    ("post", "/runs/replay"): 202,
    ("post", "/runs/{run_id}/signals/{event}"): 202,
    ("post", "/runs/{run_id}/steer"): 409,  # a body it takes, for a run that has ended
    ("post", "/runs/{run_id}/budget"): 200,
    ("put", "/tenants/{tenant}/budget"): 200,
    ("post", "/approvals/{approval_id}/decision"): 200,  # a refund run's request
    ("post", "/runs/{run_id}/resolve"): 202,
    ("post", "/runs/{run_id}/fork"): 202,
    ("post", "/runs/{run_id}/rewind"): 202,
    ("post", "/runs/{run_id}/cancel"): 202,  # last: it stops the run the others act on
}


def test_each_request_example_of_the_document_is_one_the_server_takes(
    serve: Callable[..., Server], start_worker: Callable[..., Any], client: Client
) -> None:
    server = serve()
    start_worker(concurrency=1)
    # One step: a seq 1 to fork and rewind to; a budget to raise.
    run_id = client.enqueue("square", {"n": 3}, budget_usd=1.0)
    assert client.wait(run_id, timeout=60).status == RunStatus.DONE
    asks = client.enqueue("refund", {"amount": 1})  # parks on a request to decide
    assert client.wait(asks, timeout=60).status == RunStatus.WAITING
    [approval] = client.approvals()
    with server.http() as http:
        document = http.get("/openapi.json").json()
        bodies = {
            (method, path): op["requestBody"]["content"]["application/json"]
            for path, operations in document["paths"].items()
            for method, op in operations.items()
            if "requestBody" in op
        }
        assert set(bodies) == set(TAKEN)  # a new operation with a body: add it here
        for (method, path), status in TAKEN.items():
            example = bodies[(method, path)]["example"]
            url = path.format(
                run_id=run_id,
                event="approval",
                approval_id=approval.approval_id,
                tenant=f"openapi-{run_id}",
            )
            answer = http.request(method, url, json=example)
            assert answer.status_code == status, (path, example, answer.text)
