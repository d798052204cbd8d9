"""Running the fleet: settings, the Celery app factory, the step loop, the Client, the CLI.

Users reach it through `import cairn` (cairn.Client, cairn.Settings).
"""
