"""Can this process reach what it needs? Asked by `cairn worker` before it starts."""

from __future__ import annotations

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
    leases = Leases.from_url(settings.redis_url)
    try:
        leases.ping()
    except CairnError as exc:
        found.append(str(exc))
    finally:
        leases.client.close()
    if settings.broker != settings.redis_url:
        found += broker_problems(settings)
    return found


def broker_problems(settings: Settings) -> list[str]:
    from kombu import Connection

    try:
        with Connection(settings.broker, connect_timeout=settings.client_give_up_after) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 (kombu raises the transport's own errors)
        return [f"broker {conn.as_uri()} is unreachable: {exc}"]
    return []
