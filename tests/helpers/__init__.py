"""What the tests share that is not a fixture (the fixtures are tests/conftest.py's).

- services: the servers this pytest process uses (Postgres, Redis, RabbitMQ, PgBouncer)
- runs: waiting on a condition, a run's lease holder, the probe workflow's step log, and
  the handle of a `cairn serve` the `serve` fixture started
- flows, lg_flows, pai_flows, seam_flows, chaos_flows: workflows for the workers the tests
  start (CAIRN_WORKFLOWS=tests.helpers.flows); they import nothing of the tests' own
- pages: the README's and docs' code blocks; browser: headless Chromium for the pages
- openapi.json: the HTTP API's document as pinned (tests/fleet/test_openapi.py)
"""
