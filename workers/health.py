"""Can this process reach what it needs, and open what it reads? Asked by `cairn worker`
before it starts, and by `cairn worker --check` (a probe) at any time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cairn.core.errors import CairnError

if TYPE_CHECKING:
    from cairn.core.settings import Settings


def problems(settings: Settings) -> list[str]:
    """One line per service that does not answer within CAIRN_CLIENT_GIVE_UP_AFTER."""
    from cairn.store.db import Database
    from cairn.store.lease import Leases

    found = []
    db = Database(
        settings.database_url,
        give_up_after=settings.client_give_up_after,
        prepare=settings.database_prepare,
    )
    try:
        db.one("ping")
    except CairnError as exc:
        found.append(str(exc))
    finally:
        db.close()
    leases = Leases.from_url(settings.redis)
    try:
        leases.ping()
    except CairnError as exc:
        found.append(str(exc))
    else:
        found += key_problems(settings)
    finally:
        leases.client.close()
    if settings.broker != settings.redis_url:
        found += broker_problems(settings)
    return found


def key_problems(settings: Settings) -> list[str]:
    """One line per payload key a worker lacked lately (it handed a run back for it)
    that this process's CAIRN_PAYLOAD_KEYS lacks too: it would hand such runs back."""
    from cairn.core.sealing import KeyRing
    from cairn.store.fleet import Fleet

    held = KeyRing(settings.payload_keys).ids
    fleet = Fleet.from_url(settings.redis)
    try:
        lacking = fleet.lacking(held)
    except CairnError as exc:
        return [str(exc)]
    finally:
        fleet.close()
    now = time.time()
    return [
        f"payloads are sealed under key {kid!r}, which CAIRN_PAYLOAD_KEYS lacks (it holds: "
        f"{', '.join(held) or 'none'}); a worker met one {now - at:.0f}s ago and handed "
        "its run back: add the key to CAIRN_PAYLOAD_KEYS"
        for kid, at in sorted(lacking.items())
    ]


def broker_problems(settings: Settings) -> list[str]:
    from kombu import Connection

    try:
        with Connection(settings.broker, connect_timeout=settings.client_give_up_after) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 (kombu raises the transport's own errors)
        return [f"broker {conn.as_uri()} is unreachable: {exc}"]
    return []
