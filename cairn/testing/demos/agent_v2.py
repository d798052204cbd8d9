"""Version 2 of the demo `agent` workflow (cairn.testing.demos.agent_parts says how it
differs from version 1): what `cairn chaos agent --deploy cairn.testing.demos.agent_v2`
deploys. A rename entry, a call added after the recorded ones, a state migration: every
run version 1 left goes on."""

from __future__ import annotations

from cairn.testing.demos.agent_parts import register

flow = register()
