"""What the mix's tests share: its progress lines, printed without console markup."""

from __future__ import annotations

import re


def plain(text: str) -> None:
    """A line of the mix's progress, without its console markup."""
    text = re.sub(r"(?<!\\)\[/?(bold|red|yellow|green)?\]", "", text)
    print(text.replace("\\[", "["), flush=True)
