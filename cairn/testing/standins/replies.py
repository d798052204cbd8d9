"""What a stand-in model answers, whatever API it speaks: a deterministic reply to the
last user text, the directives a test writes into its first user message (``REPLY:``,
``TOOLS:``, ``TOKEN_MS:``), and text cut into word-sized tokens for a stream."""

from __future__ import annotations

import re

_REPLY_LINE = re.compile(r"^[ \t]*REPLY: ?(.*?)\r?$", re.MULTILINE)


def reply_for(text: str) -> str:
    """Deterministic reply: ``REPLY: x`` line, else VALIDATE, else SUMMARIZE, else ack."""
    m = _REPLY_LINE.search(text)
    if m:
        return m.group(1)
    if "VALIDATE" in text:
        return "INVALID" if "INVALID" in text else "VALID"
    if "SUMMARIZE" in text:
        return "Summary: " + text[:300]
    return "ack: " + text[:80]


_TOOLS_LINE = re.compile(r"^[ \t]*TOOLS: ?(.*?)\r?$", re.MULTILINE)
_TOKEN_MS_LINE = re.compile(r"^[ \t]*TOKEN_MS: ?(\d+)\r?$", re.MULTILINE)

# A word and the whitespace before it; trailing whitespace goes with the last word.
_TOKEN = re.compile(r"\s*\S+(?:\s+\Z)?")


def _tokens(text: str) -> list[str]:
    """text cut into word-sized tokens, whitespace leading as in the model's own tokens
    (``"Hello"``, ``" world"``); they concatenate to text exactly."""
    return _TOKEN.findall(text) or ([text] if text else [])
