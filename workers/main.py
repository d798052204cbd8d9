"""The worker app built from the environment, for Celery's own command line:

    celery -A cairn.workers.main inspect active
    celery -A cairn.workers.main purge -Q celery,cairn.resume

`cairn worker` builds the same app from its options instead.
"""

from cairn.core.settings import Settings
from cairn.workers.app import create_app

app = create_app(Settings.from_env())
