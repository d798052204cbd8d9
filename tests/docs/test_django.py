"""docs/guides/enqueue.md's Django recipe, run as written: `shop/orders.py` in a Django
project made here, in a scratch folder outside the repo (an `Order` model, `shop/cairn.py`
holding the Client, Django's postgresql backend on psycopg 3 pointed at the test's
database). A commit leaves the order's run, which beat's dispatcher (here in the test's
process) sends; an exception inside `atomic` leaves no order, no run, nothing sent, also
when the enqueue is the block's first statement; outside `atomic` (Django's autocommit)
the run commits at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.core.settings import Settings
from cairn.core.status import RunStatus
from cairn.store.checkpoints import PgStore
from cairn.workers.dispatch import Dispatcher
from tests.helpers import pages

pytest.importorskip("django")

RECIPE = pages.starting("# shop/orders.py")

PROJECT = {
    "settings.py": """\
import os
from urllib.parse import urlsplit

url = urlsplit(os.environ["CAIRN_DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 when it is installed
        "NAME": url.path.lstrip("/"),
        "HOST": url.hostname,
        "PORT": url.port,
        "USER": url.username,
        "PASSWORD": url.password or "",
    }
}
INSTALLED_APPS = ["shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
SECRET_KEY = "not a secret: a test project"
USE_TZ = True
""",
    "shop/__init__.py": "",
    "shop/models.py": """\
from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    email = models.CharField(max_length=200)
""",
    "shop/cairn.py": """\
import atexit

import cairn

client = cairn.Client()  # CAIRN_DATABASE_URL, CAIRN_REDIS_URL
atexit.register(client.close)
""",
    # What a view does: an order that commits, and one whose request fails inside atomic.
    "main.py": """\
import json
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
import django

django.setup()
from django.db import connection, transaction

import psycopg
from shop.models import Order
from shop.orders import place_order

assert isinstance(connection.cursor().connection, psycopg.Connection)  # psycopg 3's
with connection.schema_editor() as editor:
    editor.create_model(Order)
committed = place_order("acme", "billing@acme.test")
rolled_back = None
try:
    with transaction.atomic():
        rolled_back = place_order("initech", "ap@initech.test")
        raise RuntimeError("the card was declined")
except RuntimeError:
    pass
# The enqueue as the atomic block's first statement (psycopg's transaction not begun yet),
# rolled back; then one outside any block (Django's autocommit: the run's own transaction).
from shop.cairn import client

first = None
try:
    with transaction.atomic():
        connection.ensure_connection()
        first = client.enqueue("invoice", {"customer": "globex", "email": "ap@globex.test"},
                               run_id="first-in-atomic", connection=connection.connection)
        raise RuntimeError("the card was declined")
except RuntimeError:
    pass
connection.ensure_connection()
outside = client.enqueue("invoice", {"customer": "umbrella", "email": "ap@umbrella.test"},
                         run_id="outside-atomic", connection=connection.connection)
print(json.dumps({"committed": committed, "rolled_back": rolled_back, "first": first,
                  "outside": outside,
                  "orders": list(Order.objects.values_list("customer", flat=True))}))
""",
}


@pytest.fixture
def sent(store: PgStore) -> Iterator[list[str]]:
    """The run ids beat's dispatcher sends, heard from this test's database."""
    sent: list[str] = []
    dispatcher = Dispatcher(store=store, send=lambda run_id, prio: sent.append(run_id), tick=0.2)
    stop = dispatcher.start()
    assert dispatcher.listening.wait(10)
    yield sent
    stop.set()


def test_the_django_recipe_commits_an_order_with_its_run_or_neither(
    settings: Settings, store: PgStore, sent: list[str], tmp_path: Path
) -> None:
    for name, code in {**PROJECT, "shop/orders.py": RECIPE.code}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)
    out = subprocess.run(
        [sys.executable, "main.py"],
        cwd=tmp_path,
        env=pages.user_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    committed, rolled_back = got["committed"], got["rolled_back"]
    assert got["orders"] == ["acme"]
    run = store.get(committed)
    assert run is not None and run.status == RunStatus.PENDING
    assert run.input == {"customer": "acme", "email": "billing@acme.test"}
    deadline = time.monotonic() + 5
    while committed not in sent:
        assert time.monotonic() < deadline, f"{committed} was not sent after its commit"
        time.sleep(0.02)
    assert rolled_back is not None and rolled_back != committed
    assert store.get(rolled_back) is None
    # The atomic block whose first statement was the enqueue: rolled back with it.
    assert got["first"] == "first-in-atomic" and store.get("first-in-atomic") is None
    # Outside any atomic block Django's connection is autocommit: the run commits at once.
    assert got["outside"] == "outside-atomic" and store.get("outside-atomic") is not None
    deadline = time.monotonic() + 5
    while "outside-atomic" not in sent:
        assert time.monotonic() < deadline, "the autocommit enqueue was not sent"
        time.sleep(0.02)
    time.sleep(0.3)  # a send after a rollback would have come by now
    assert sorted(sent) == sorted([committed, "outside-atomic"])
