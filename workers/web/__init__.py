"""`cairn serve`: the HTTP API (api.py) and the pages of runs (pages.py) in one process.

Both are thin over cairn.Client: what a Python caller can do, an HTTP caller can do.
"""
