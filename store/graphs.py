"""LangGraph's checkpoints on cairn's Postgres, as bytes: the SQL half of
cairn.langgraph.CairnSaver, which serializes (with LangGraph's own serializer) and calls in.

A put inside a cairn run is fenced twice: by the run's lease epoch (a worker that lost the
run writes nothing; the run's row is share-locked first, so a claim waits for a put in
flight and a put never commits after a claim) and by the thread's order (a checkpoint is
only the next one of its thread, never a fork or a rewind of it). Outside a run a put is LangGraph's plain upsert,
so its own forks (time travel) work as they do on its Postgres saver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg

from cairn.store.db import Database
from cairn.store.payloads import Clear
from cairn.store.sql import QUERIES


@dataclasses.dataclass(frozen=True)
class Blob:
    """One channel's value at a version: the serializer's (type, bytes), or the tail a list
    appends to the value at base_version (length: the whole list's)."""

    channel: str
    version: str
    type: str
    blob: bytes | None
    base_version: str | None = None
    length: int | None = None


@dataclasses.dataclass(frozen=True)
class Fence:
    """The cairn run a put belongs to: its id and the lease epoch of the worker writing."""

    run_id: str
    epoch: int


class GraphStore:
    """The graph_* tables (migration 0008) on a cairn Database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def put(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        parent_id: str | None,
        checkpoint: tuple[str, bytes],
        versions: dict[str, str],
        metadata: Mapping[str, Any],  # LangGraph's CheckpointMetadata, a TypedDict
        blobs: Sequence[Blob],
        fence: Fence | None = None,
    ) -> bool:
        """Write a checkpoint and its new blobs in one transaction; False if fenced (the
        run moved to another worker, or the checkpoint is not the thread's next one).
        versions: the version of each channel whose value is in a blob, new or older."""
        row = {
            "thread_id": thread_id,
            "ns": ns,
            "checkpoint_id": checkpoint_id,
            "parent_id": parent_id,
            "type": checkpoint[0],
            "checkpoint": checkpoint[1],
            "versions": Clear(versions),
            "metadata": Clear(metadata),
            "run_id": fence.run_id if fence else None,
            "epoch": fence.epoch if fence else None,
        }
        blob_rows = [{"thread_id": thread_id, "ns": ns, **dataclasses.asdict(b)} for b in blobs]

        def write() -> bool:
            with self.db.connection() as conn, conn.transaction():
                if fence is not None and not self._fence(conn, fence):
                    raise _Fenced
                if blob_rows:
                    conn.cursor().executemany(QUERIES["graph_put_blob"], blob_rows)
                query = "graph_put_fenced" if fence else "graph_put"
                if conn.execute(QUERIES[query], row).fetchone() is not None:
                    return True
                # A retry after a lost commit reply finds its own row: not fenced.
                own = conn.execute(QUERIES["graph_own"], row).fetchone()
                if own is None:
                    raise _Fenced
                return True

        try:
            return self.db.retry(write)
        except _Fenced:
            return False

    def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        task_path: str,
        writes: Iterable[tuple[int, str, str, bytes]],
        replace: bool,
        fence: Fence | None = None,
    ) -> bool:
        """A task's writes (idx, channel, type, bytes); replace: the special channels' rows
        are written again (the last wins), others are kept as first written. False if the
        run is fenced."""
        rows = [
            {
                "thread_id": thread_id,
                "ns": ns,
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "task_path": task_path,
                "idx": idx,
                "channel": channel,
                "type": type_,
                "blob": blob,
            }
            for idx, channel, type_, blob in writes
        ]

        def write() -> bool:
            with self.db.connection() as conn, conn.transaction():
                if fence is not None and not self._fence(conn, fence):
                    return False
                query = "graph_put_write_replace" if replace else "graph_put_write"
                conn.cursor().executemany(QUERIES[query], rows)
                return True

        return self.db.retry(write)

    def _fence(self, conn: psycopg.Connection[Any], fence: Fence) -> bool:
        """The transaction's first statement: the run's row share-locked at the writer's
        epoch (a claim waits for this transaction, which may sit idle only so long), or
        False: another worker has claimed the run."""
        params = {"run_id": fence.run_id, "epoch": fence.epoch, "hold": self.db.hold}
        return conn.execute(QUERIES["graph_fence"], params).fetchone() is not None

    def get(self, thread_id: str, ns: str, checkpoint_id: str | None) -> dict[str, Any] | None:
        """The checkpoint (the thread's latest without checkpoint_id) with its blobs (each
        channel's chain of rows, oldest first) and its pending writes."""
        row = self.db.one(
            "graph_get", {"thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id}
        )
        return self._whole(row) if row else None

    def list(
        self,
        thread_id: str | None,
        ns: str | None,
        checkpoint_id: str | None,
        metadata: dict[str, Any] | None,
        before: str | None,
        limit: int | None,
    ) -> list[dict[str, Any]]:
        """Checkpoints newest first, each as get() returns it."""
        rows = self.db.all(
            "graph_list",
            {
                "thread_id": thread_id,
                "ns": ns,
                "checkpoint_id": checkpoint_id,
                "filter": Clear(metadata) if metadata else None,
                "before": before,
                "limit": limit,
            },
        )
        return [self._whole(r) for r in rows]

    def _whole(self, row: dict[str, Any]) -> dict[str, Any]:
        key = {"thread_id": row["thread_id"], "ns": row["ns"]}
        blobs = self.db.all("graph_blobs_of", {**key, "versions": Clear(row["versions"] or {})})
        writes = self.db.all("graph_writes_of", {**key, "checkpoint_id": row["checkpoint_id"]})
        return {**row, "blobs": blobs, "writes": writes}

    def delete_thread(self, thread_id: str) -> None:
        self.db.one("graph_delete_threads", {"thread_ids": [thread_id]})

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.db.one("graph_delete_for_runs", {"run_ids": list(run_ids)})

    def copy_thread(self, source: str, target: str) -> None:
        self.db.one("graph_copy_thread", {"source": source, "target": target})

    def prune(self, thread_ids: Sequence[str], keep_latest: bool) -> None:
        query = "graph_prune_keep_latest" if keep_latest else "graph_delete_threads"
        self.db.one(query, {"thread_ids": list(thread_ids)})


class _Fenced(Exception):
    """A fenced put: raised inside the retried write so a retry does not run again."""
