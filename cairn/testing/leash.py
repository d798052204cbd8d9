"""Process groups that die with the process that started them, however it dies.

A process in a session of its own (fleet.Proc: a worker and its pool, beat, a server)
outlives its parent: a test run ended by SIGTERM left its Celery workers running, bound
to the Redis database they had been given, and one of them later took and dropped
another run's messages. PR_SET_PDEATHSIG is not enough: it fires when the *thread* that
started the child ends, and the chaos rig starts workers from threads that end at once.

So a watchdog: `hold(pgid)` starts one per process, in a session of its own, and tells
it the group. The watchdog reads the groups from a pipe whose writing end only this
process has: it reads end-of-file when this process dies, even by SIGKILL, and then
SIGKILLs every group it still holds. Run as `python -m cairn.testing.leash`.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading

_lock = threading.Lock()
_watchdog: subprocess.Popen[bytes] | None = None
_owner = 0  # the pid _watchdog belongs to: a forked child starts a watchdog of its own


def hold(pgid: int) -> None:
    """SIGKILL process group pgid when this process dies, unless dropped first."""
    _tell(f"+{pgid}\n")


def drop(pgid: int) -> None:
    """Forget pgid (its group is gone: its number may be reused)."""
    _tell(f"-{pgid}\n")


def _tell(line: str) -> None:
    global _watchdog, _owner
    with _lock:
        if _watchdog is None or _owner != os.getpid():
            if _owner == 0:
                atexit.register(_release)
            _watchdog = subprocess.Popen(
                [sys.executable, "-m", "cairn.testing.leash"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # not in the terminal's group: a Ctrl-C is ours
            )
            _owner = os.getpid()
        assert _watchdog.stdin is not None
        try:
            _watchdog.stdin.write(line.encode())
            _watchdog.stdin.flush()
        except BrokenPipeError:  # the watchdog was killed: the next call starts another
            _watchdog.wait()
            _watchdog = None


def _release() -> None:
    """A normal exit: what is still held goes now, as it would at any other."""
    if _watchdog is not None and _owner == os.getpid() and _watchdog.stdin is not None:
        try:
            _watchdog.stdin.close()
        except BrokenPipeError:
            pass
        _watchdog.wait(30)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    held: set[int] = set()
    for line in sys.stdin.buffer:
        pgid = int(line[1:])
        if line.startswith(b"+"):
            held.add(pgid)
        else:
            held.discard(pgid)
    for pgid in held:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # gone already


if __name__ == "__main__":
    main()
