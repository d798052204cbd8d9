"""LangGraph on cairn: CairnSaver, a LangGraph checkpointer on cairn's Postgres.

    from cairn.langgraph import CairnSaver

    graph = builder.compile(checkpointer=CairnSaver())   # CAIRN_DATABASE_URL

It is LangGraph's `BaseCheckpointSaver` (sync and async methods), with what its Postgres
saver does not do:

- **Flat growth.** A list channel (a message history) that extends the value this saver
  last wrote or read is stored as the tail it appends, so each step writes its new
  messages, not the whole history again.
- **Fencing.** Inside a cairn run (a graph invoked from a step), every put is fenced by the
  run's lease epoch and must be its thread's next checkpoint: a worker that lost the run
  (paused past its lease, say) can neither write after the new owner nor fork or rewind
  the thread; it stops with cairn's StaleWrite. Outside a run, puts are LangGraph's plain
  upsert, and its forks from older checkpoints (time travel) work as usual.

Schema: cairn's migrations (`cairn db upgrade`). Needs the extra:
`pip install 'cairn[langgraph]'`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import functools
import inspect
import json
import re
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # the optional extra is missing
    raise ImportError(
        f"cairn.langgraph needs langgraph ({exc}); install it with pip install 'cairn[langgraph]'"
    ) from exc

from cairn.core.errors import CairnError, EventRefused, StaleWrite
from cairn.core.settings import Settings
from cairn.steps.context import Context, current
from cairn.steps.registry import DONE, Retry, StepResult, Workflow
from cairn.steps.registry import workflow as cairn_workflow
from cairn.store.db import Database
from cairn.store.graphs import Blob, Fence, GraphStore

__all__ = ["RESUME", "CairnSaver", "graph_workflow", "idempotency_key", "node", "workflow"]

RESUME = "resume"
"""The signal a run of `graph_workflow()` waits for when its graph called interrupt()."""

_INLINE = (str, int, float, bool)  # small values ride in the checkpoint row itself
_KNOWN_LISTS = 512  # list channels remembered for appends, most recently used
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # what a journal scope's name cannot hold


class CairnSaver(BaseCheckpointSaver[int]):
    """LangGraph checkpoints in cairn's Postgres (the graph_* tables).

    settings: where Postgres is (default: inside a cairn run, the worker's settings;
    elsewhere the CAIRN_* environment). store: a GraphStore to use instead (a pool you
    already have).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        serde: SerializerProtocol | None = None,
        store: GraphStore | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self._settings = settings
        self._store = store
        self._pools: dict[str, GraphStore] = {}  # by database URL: pools this saver opened
        # (thread, ns, channel) -> (version, a copy of the list): what a later version of
        # the channel may extend. A copy, so a list edited in place is not taken for one
        # that was extended.
        self._lists: collections.OrderedDict[tuple[str, str, str], tuple[str, list[Any]]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    @property
    def store(self) -> GraphStore:
        return self._store_of(current())

    def _store_of(self, ctx: Context | None) -> GraphStore:
        if self._store is not None:
            return self._store
        s = self._settings or (ctx.config if ctx is not None else None) or Settings.from_env()
        with self._lock:
            store = self._pools.get(s.database_url)
            if store is None:
                db = Database(
                    s.database_url,
                    prepare=s.database_prepare,
                    give_up_after=s.store_give_up_after,
                    hold=s.lease_ttl,
                )
                store = self._pools[s.database_url] = GraphStore(db.open())
        return store

    def close(self) -> None:
        """Close the pools this saver opened (not a store it was given)."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for store in pools:
            store.db.close()

    # -- writing -----------------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        inline: dict[str, Any] = {}
        versions: dict[str, str] = {}
        blobs: list[Blob] = []
        for channel, value in checkpoint["channel_values"].items():
            version = checkpoint["channel_versions"].get(channel)
            if value is None or isinstance(value, _INLINE) or version is None:
                inline[channel] = value
                continue
            versions[channel] = str(version)
            if channel in new_versions:  # older versions are in their blobs already
                blobs.append(self._blob(thread_id, ns, channel, str(new_versions[channel]), value))
        row = {**checkpoint, "channel_values": inline}
        ctx = _run_of_thread(thread_id)
        fence = Fence(ctx.run_id, ctx.epoch) if ctx is not None else None
        if not self._store_of(ctx).put(
            thread_id,
            ns,
            checkpoint["id"],
            conf.get("checkpoint_id"),
            self.serde.dumps_typed(row),
            versions,
            get_serializable_checkpoint_metadata(config, metadata),
            blobs,
            fence,
        ):
            raise _stale(fence, f"checkpoint {checkpoint['id']} of thread {thread_id!r}")
        if ctx is not None:
            # The put landed before any claim (a claim waits for a put in flight); a worker
            # resumed from a pause past its lease learns here that the run moved on, and
            # runs no further node.
            ctx.ensure_owner(cancel=False)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _blob(self, thread_id: str, ns: str, channel: str, version: str, value: Any) -> Blob:
        """value at version: the tail it appends to the list this saver last saw for the
        channel, when it extends that list; else the whole value."""
        key = (thread_id, ns, channel)
        if isinstance(value, list):
            with self._lock:
                known = self._lists.get(key)
            if known is not None and 0 < len(known[1]) <= len(value):
                base_version, base = known
                n = len(base)
                if all(a == b for a, b in zip(value[:n], base, strict=True)):
                    tail = value[n:]
                    self._remember(key, version, [*base, *copy.deepcopy(tail)])
                    type_, data = self.serde.dumps_typed(tail)
                    return Blob(channel, version, type_, data, base_version, len(value))
            self._remember(key, version, copy.deepcopy(value))
        type_, data = self.serde.dumps_typed(value)
        return Blob(
            channel, version, type_, data, None, len(value) if isinstance(value, list) else None
        )

    def _remember(self, key: tuple[str, str, str], version: str, value: list[Any]) -> None:
        with self._lock:
            self._lists[key] = (version, value)
            self._lists.move_to_end(key)
            while len(self._lists) > _KNOWN_LISTS:
                self._lists.popitem(last=False)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        rows = [
            (WRITES_IDX_MAP.get(channel, idx), channel, *self.serde.dumps_typed(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        ctx = _run_of_thread(str(conf["thread_id"]))
        fence = Fence(ctx.run_id, ctx.epoch) if ctx is not None else None
        if not self._store_of(ctx).put_writes(
            str(conf["thread_id"]),
            conf.get("checkpoint_ns", ""),
            conf["checkpoint_id"],
            task_id,
            task_path,
            rows,
            replace=all(channel in WRITES_IDX_MAP for channel, _ in writes),
            fence=fence,
        ):
            raise _stale(fence, f"writes of task {task_id}")

    # -- reading -----------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        row = self.store.get(
            str(conf["thread_id"]), conf.get("checkpoint_ns", ""), get_checkpoint_id(config)
        )
        return self._tuple(row) if row else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        conf = (config or {}).get("configurable", {})
        thread_id = conf.get("thread_id")
        rows = self.store.list(
            str(thread_id) if thread_id is not None else None,
            conf.get("checkpoint_ns"),
            conf.get("checkpoint_id"),
            filter,
            get_checkpoint_id(before) if before else None,
            limit,
        )
        for row in rows:
            yield self._tuple(row)

    def _tuple(self, row: dict[str, Any]) -> CheckpointTuple:
        thread_id, ns = row["thread_id"], row["ns"]
        checkpoint: Checkpoint = self.serde.loads_typed((row["type"], row["checkpoint"]))
        values = dict(checkpoint["channel_values"])
        chains: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for blob in row["blobs"]:
            chains[blob["channel"]].append(blob)
        for channel, chain in chains.items():
            parts = [self.serde.loads_typed((b["type"], b["blob"])) for b in chain]
            value = parts[0] if len(parts) == 1 else [x for part in parts for x in part]
            if value is not None or chain[-1]["type"] != "empty":
                values[channel] = value
            if isinstance(value, list):  # the next put of the channel may extend it
                self._remember((thread_id, ns, channel), chain[-1]["version"], copy.deepcopy(value))
        checkpoint["channel_values"] = values
        parent = row["parent_id"]
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": row["checkpoint_id"],
                }
            },
            checkpoint=checkpoint,
            metadata=row["metadata"],
            parent_config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": parent,
                }
            }
            if parent
            else None,
            pending_writes=[
                (w["task_id"], w["channel"], self.serde.loads_typed((w["type"], w["blob"])))
                for w in row["writes"]
            ],
        )

    # -- deleting and copying ---------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        self.store.delete_thread(str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            self.store.delete_for_runs([str(r) for r in run_ids])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.store.copy_thread(str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy {strategy!r}: 'keep_latest' or 'delete'")
        if thread_ids:
            self.store.prune([str(t) for t in thread_ids], keep_latest=strategy == "keep_latest")

    # -- async: the same, off the event loop ------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


def graph_workflow(
    name: str, graph: Any, *, retry: Retry | None = None, **options: Any
) -> Workflow:
    """Register a compiled graph as the cairn workflow name: enqueue it with the graph's
    input; the run is one invocation of the graph on thread run_id, on the fleet.

    The graph must be compiled with checkpointer=CairnSaver(): its checkpoints are the
    run's progress. A run killed mid-graph goes on from the last checkpoint (the nodes it
    finished are not run again). When a node calls interrupt(), the run waits for the
    signal "resume" holding no worker, with the interrupts in state["interrupts"]; the
    signal's payload is the resume value (Command(resume=payload)). The interrupts are in
    the approvals inbox (Client.approvals): a decision there (Client.decide) resumes the
    graph with {"decision", "args", "note", "approval_id", "by"}. When the graph ends,
    state["output"] is its final state as JSON.
    """
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, CairnSaver):
        raise CairnError(
            f"workflow {name!r}: the graph's checkpointer is {type(saver).__name__}; compile "
            "it with builder.compile(checkpointer=cairn.langgraph.CairnSaver()) so its "
            "checkpoints are the run's progress"
        )
    from langgraph.types import Command
    from pydantic_core import to_jsonable_python

    flow = cairn_workflow(name, **options)

    @flow.step("graph", retry=retry)
    def run_graph(ctx: Context) -> StepResult:
        config: RunnableConfig = {"configurable": {"thread_id": ctx.run_id}}
        if ctx.state.get("interrupts"):
            start: Any = Command(resume=ctx.signal)
        elif saver.get_tuple(config) is not None:
            start = None  # killed mid-graph: go on from the last checkpoint
        else:
            start = dict(ctx.input)
        # durability="sync": a node's checkpoint is written before the next one runs, so
        # a kill costs at most the node in hand. Streamed, so the run's live events show
        # the graph as it goes: each node that finished, what nodes write to LangGraph's
        # stream writer, and a chat model's text as tokens.
        _graph_runs[ctx.run_id] = ctx
        output = None
        try:
            for mode, chunk in graph.stream(
                start, config, durability="sync", stream_mode=[*_MODES]
            ):
                if mode == "values":
                    output = chunk
                else:
                    _tell(ctx, mode, chunk)
        finally:
            if _graph_runs.get(ctx.run_id) is ctx:
                del _graph_runs[ctx.run_id]
        waiting = graph.get_state(config).interrupts
        if waiting:
            pending = [
                {"id": i.id, "value": to_jsonable_python(i.value, fallback=str)} for i in waiting
            ]
            return StepResult.wait(
                RESUME, cursor="graph", state={"interrupts": pending}, request=_request(pending)
            )
        done = to_jsonable_python(output, fallback=str)
        return StepResult(cursor=DONE, state={"output": done, "interrupts": None})

    return flow


def _request(pending: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run asks the approvals inbox: the first interrupt's value read as Agent
    Inbox's HumanInterrupt ({"action_request": {"action", "args"}, "description"}), or as
    {"tool", "args", "prompt"}, else as the prompt; and every interrupt."""
    value = pending[0]["value"]
    asked: dict[str, Any] = {"interrupts": pending}
    if isinstance(value, dict):
        action = value.get("action_request")
        if isinstance(action, dict):
            asked.update(tool=action.get("action"), args=action.get("args"))
            asked["prompt"] = value.get("description")
        else:
            asked.update({k: value[k] for k in ("tool", "args", "prompt") if k in value})
    else:
        asked["prompt"] = value if isinstance(value, str) else json.dumps(value)
    if not isinstance(asked.get("tool"), str) or not asked["tool"]:
        asked.pop("tool", None)  # a request's tool is a name, or none
    return asked


# Its name until 0.1: `cairn.workflow` is the step API's; this one registers a graph.
workflow = graph_workflow

_MODES = ("values", "updates", "custom", "messages")


def _tell(ctx: Context, mode: str, chunk: Any) -> None:
    """One LangGraph stream item as a run event, queued (the node does not wait)."""
    from pydantic_core import to_jsonable_python

    if mode == "messages":
        message, _ = chunk
        text = getattr(message, "content", "")
        if isinstance(text, str) and text and type(message).__name__.endswith("Chunk"):
            ctx.token(text)
    elif mode == "updates":
        for name in chunk if isinstance(chunk, dict) else ():
            ctx.emit("graph.node", {"node": str(name)}, wait=False)
    elif mode == "custom":
        try:
            ctx.emit("graph.custom", to_jsonable_python(chunk, fallback=str), wait=False)
        except EventRefused as exc:  # too big to show live: say so, the run goes on
            ctx.emit("graph.custom", {"refused": str(exc)[:500]}, wait=False)


F = TypeVar("F", bound=Callable[..., Any])


def node(fn: F) -> F:
    """Decorate a graph node that makes journaled calls (ctx.call, ctx.model and their
    async forms, through cairn.current()): its calls get a journal scope of their own,
    named by the node and LangGraph's super-step. A run resumed from the graph's last
    checkpoint skips the nodes already done; without scopes the calls after them would
    take their places in the step's journal, with scopes each node finds its own records.
    Outside a cairn run it only calls fn."""

    def scope() -> Any:
        ctx = current()
        if ctx is None:
            return contextlib.nullcontext()
        from langgraph.config import get_config

        meta = get_config().get("metadata", {})
        name = f"{meta.get('langgraph_node', fn.__name__)}.{meta.get('langgraph_step', 0)}"
        return ctx.scope(_UNSAFE.sub("_", name)[:100])

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with scope():
                return await fn(*args, **kwargs)

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with scope():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def idempotency_key(config: RunnableConfig | None = None) -> str:
    """Inside a node of a graph a cairn run drives: the key of the node's one external
    effect, from run and LangGraph's task (namespace, node and task id). A node run again
    (after a kill before its checkpoint, or after the interrupt it raised was answered)
    sends the same key, so the downstream dedupes it."""
    from langgraph.config import get_config

    ctx = current()
    if ctx is None:
        raise CairnError("cairn.langgraph.idempotency_key() is for a node inside a cairn run")
    meta = (config or get_config()).get("metadata", {})
    task = meta.get("langgraph_checkpoint_ns") or meta.get("checkpoint_ns")
    if not task:
        raise CairnError("cairn.langgraph.idempotency_key(): call it inside a graph node")
    ctx.ensure_owner()  # a worker that lost the run, or a cancelled run, must not reach it
    return f"cairn:{ctx.run_id}:{task}"


# The step running each thread (its run's) graph in this process. LangGraph puts a task's
# writes from its executor thread outside the task's context when it streams custom or
# messages, where cairn.current() is None: the thread id still says whose they are.
_graph_runs: weakref.WeakValueDictionary[str, Context] = weakref.WeakValueDictionary()


def _run_of_thread(thread_id: str) -> Context | None:
    """The cairn step a put for thread_id belongs to, if one runs it here."""
    ctx = current()
    return ctx if ctx is not None else _graph_runs.get(thread_id)


def _stale(fence: Fence | None, what: str) -> StaleWrite:
    assert fence is not None  # only a fenced write is refused
    error = StaleWrite(fence.run_id, -1, fence.epoch)
    message = (
        f"run {fence.run_id}: {what} refused: another worker owns the run (epoch "
        f"{fence.epoch} is stale), or the thread has moved past this checkpoint's parent"
    )
    error.args = (message,)
    return error
