"""The chaos workers' app: the worker app, with FaultHooks (middleware) from the plan in
CAIRN_FAULTS.

celery -A cairn.testing.faulted worker ...     (started by `cairn chaos`)
"""

from cairn.core.settings import Settings
from cairn.testing.faults import FaultHooks
from cairn.workers.app import create_app

app = create_app(Settings.from_env(), middleware=[FaultHooks.from_env()])
