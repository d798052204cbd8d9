"""``python -m cairn.testing.standins mail|model [options]``: one stand-in in the
foreground (cairn.testing.standins.cli)."""

from __future__ import annotations

import sys

from cairn.testing.standins.cli import main

if __name__ == "__main__":
    sys.exit(main())
