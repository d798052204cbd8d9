"""`python -m workers.chaos chaos WORKFLOW ...`"""

from __future__ import annotations

from cairn.testing.chaos.cli import main

if __name__ == "__main__":
    main()
