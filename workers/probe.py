"""A Celery app that knows only the broker, for health probes that ask a worker to answer:

    celery -A cairn.workers.probe inspect ping --destination cairn@$HOSTNAME --timeout 10

The worker's main process answers through the broker, so a reply proves both that it
runs its event loop and that it reaches the broker. Light on purpose (no workflows, no
SDK): the Docker HEALTHCHECK and the Kubernetes probes run it every few seconds.
"""

from celery import Celery

from cairn.core.settings import Settings
from cairn.workers import broker

app = Celery("cairn")
app.conf.update(broker.conf(Settings.from_env()))
