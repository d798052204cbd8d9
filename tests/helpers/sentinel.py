"""A local Redis Sentinel group on real processes: a master, a replica and three
sentinels (`redis-server --sentinel`), for the failover tests. Ports from
CAIRN_SENTINEL_BASE_PORT (default 63820): master, replica, then the three sentinels."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.helpers.runs import wait_for

MASTER_NAME = "cairnmaster"
BASE = int(os.environ.get("CAIRN_SENTINEL_BASE_PORT", "63820"))
HOST = "127.0.0.1"


class SentinelGroup:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {"master": BASE, "replica": BASE + 1}
        self.sentinel_ports = [BASE + 2, BASE + 3, BASE + 4]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """kombu's form: every sentinel, the first with the database."""
        first, *rest = self.sentinel_ports
        return ";".join([f"sentinel://{HOST}:{first}/0", *(f"sentinel://{HOST}:{p}" for p in rest)])

    def _start(self, port: int, conf: str, *extra: str) -> None:
        path = self.root / f"{port}.conf"
        path.write_text(f"{conf}logfile {self.root / f'{port}.log'}\n")
        self.procs[port] = subprocess.Popen(["redis-server", str(path), *extra])
        client = redis.Redis(HOST, port, socket_connect_timeout=1)
        wait_for(lambda: _pings(client), 20, f"redis on {port}")
        client.close()

    def start(self) -> SentinelGroup:
        plain = f'bind {HOST}\nsave ""\nappendonly no\ndir {self.root}\n'
        m, r = self.ports["master"], self.ports["replica"]
        self._start(m, f"port {m}\n{plain}dbfilename m.rdb\n")
        self._start(r, f"port {r}\n{plain}dbfilename r.rdb\nreplicaof {HOST} {m}\n")
        for p in self.sentinel_ports:
            self._start(
                p,
                f"port {p}\nbind {HOST}\ndir {self.root}\n"
                f"sentinel monitor {MASTER_NAME} {HOST} {m} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n",
                "--sentinel",
            )
        wait_for(self._settled, 30, "the sentinels to see the replica and each other")
        return self

    def _settled(self) -> bool:
        for p in self.sentinel_ports:
            s = redis.Redis(HOST, p, socket_connect_timeout=1, decode_responses=True)
            try:
                info = s.sentinel_master(MASTER_NAME)
            except redis.RedisError:
                return False
            finally:
                s.close()
            if int(info["num-slaves"]) < 1 or int(info["num-other-sentinels"]) < 2:
                return False
        return True

    def master_port(self) -> int | None:
        s = redis.Redis(HOST, self.sentinel_ports[0], socket_connect_timeout=1)
        try:
            _, port = s.sentinel_get_master_addr_by_name(MASTER_NAME)
            return int(port)
        except (redis.RedisError, TypeError):
            return None
        finally:
            s.close()

    def kill_master(self) -> int:
        """SIGKILL the server that is master now; its port."""
        port = self.master_port()
        assert port is not None
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(10)
        return port

    def wait_promoted(self, old: int, timeout: float = 60.0) -> float:
        """Seconds until the sentinels name a new master that answers as one."""
        t0 = time.monotonic()

        def promoted() -> bool:
            port = self.master_port()
            if port in (None, old):
                return False
            c = redis.Redis(HOST, port, socket_connect_timeout=1, decode_responses=True)
            try:
                return c.info("replication")["role"] == "master"
            except redis.RedisError:
                return False
            finally:
                c.close()

        wait_for(promoted, timeout, "a replica promoted")
        return time.monotonic() - t0

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
