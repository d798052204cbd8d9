"""CAIRN_REDIS_URL's Sentinel form (kombu's) and CAIRN_REDIS_SENTINEL_MASTER, parsed."""

from __future__ import annotations

import pytest

from cairn.core.redisurl import RedisUrlError, parse_sentinel, strip_master, with_master
from cairn.core.settings import Settings
from cairn.workers.broker import conf

URL = "sentinel://:s3cret@h1:26379/2;sentinel://h2:26380;sentinel://h3"


def test_a_sentinel_url_names_its_sentinels_master_password_and_database() -> None:
    s = Settings.from_env({"CAIRN_REDIS_URL": URL, "CAIRN_REDIS_SENTINEL_MASTER": "mymaster"})
    address = parse_sentinel(s.redis)
    assert address.sentinels == (("h1", 26379), ("h2", 26380), ("h3", 26379))
    assert (address.master, address.password, address.db) == ("mymaster", "s3cret", 2)
    assert strip_master(s.redis) == URL
    # Celery gets kombu's own form and the master's name as its transport option.
    c = conf(s)
    assert c["broker_url"] == URL
    assert c["broker_transport_options"]["master_name"] == "mymaster"


def test_a_plain_url_is_left_alone() -> None:
    s = Settings.from_env({"CAIRN_REDIS_URL": "redis://h:6379/1"})
    assert s.redis == "redis://h:6379/1"
    assert "master_name" not in conf(s)["broker_transport_options"]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CAIRN_REDIS_URL": URL}, "set CAIRN_REDIS_SENTINEL_MASTER"),
        (
            {"CAIRN_REDIS_URL": "sentinel://:pw@h1;redis://h2", "CAIRN_REDIS_SENTINEL_MASTER": "m"},
            "address 2 is not sentinel://host:port",
        ),
        (
            {"CAIRN_REDIS_URL": "sentinel://:pw@h1:port", "CAIRN_REDIS_SENTINEL_MASTER": "m"},
            "address 1 has a bad port",
        ),
        (
            {"CAIRN_REDIS_URL": "sentinel://h1/x", "CAIRN_REDIS_SENTINEL_MASTER": "m"},
            "database 'x' is not a number",
        ),
        (
            {"CAIRN_REDIS_URL": "redis://h:6379/0", "CAIRN_REDIS_SENTINEL_MASTER": "m"},
            "CAIRN_REDIS_SENTINEL_MASTER is set but CAIRN_REDIS_URL lists no sentinel",
        ),
    ],
)
def test_a_bad_sentinel_setting_is_one_clear_line(env: dict[str, str], says: str) -> None:
    with pytest.raises(SystemExit) as exc:
        Settings.from_env(env)
    message = str(exc.value)
    assert says in message and "\n" not in message
    assert "pw" not in message  # the password is never repeated


def test_with_master_replaces_a_master_name_already_there() -> None:
    assert parse_sentinel(with_master(with_master(URL, "a"), "b")).master == "b"
    with pytest.raises(RedisUrlError):
        parse_sentinel("sentinel://;")
