"""The step API: workflows, their named steps, the registry, and step results."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import importlib
import os
import re
import sys
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cairn.core.errors import InvalidInput, Transient, UnknownWorkflow
from cairn.core.records import Wait

if TYPE_CHECKING:
    from cairn.steps.context import Context

DONE = "done"
_STEP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_CHILD_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CHILDREN = 10_000  # per spawn: one statement writes them with the parent's save


@dataclasses.dataclass(frozen=True)
class Child:
    """A run to start from a step (StepResult.spawn). key names it among its spawn's
    children (default: its place in the list); its run id is the parent's, the step's
    cursor and visit, and the key, so a replay of the step spawns the same runs."""

    workflow: str
    input: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    key: str | None = None


@dataclasses.dataclass(frozen=True)
class Spawn:
    """The children a step starts, and how many of them must stop before the parent
    goes on."""

    children: tuple[Child, ...]
    need: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepResult:
    """What a step returns: where to go next and what changed.

    cursor: the next step's name, or "done".
    state: keys merged into the run's state.
    window: the new model window (None leaves it as it was).
    cost_usd: cost not already counted by ctx.model (ctx.model counts its own calls).
    sleep: seconds (or a timedelta) to park the run before the step `cursor` runs,
        holding no worker and no broker message: beat wakes it when the time comes. A
        signal does not end a sleep (it is kept for a later wait of its event); a
        cancel stops the run at once. To be woken early by a signal, wait for it with
        a timeout: StepResult.wait(event, cursor=..., timeout=...).
    """

    cursor: str
    state: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    window: list[dict[str, Any]] | None = None
    cost_usd: float = 0.0
    sleep: float | dt.timedelta | None = None
    waits_for: Wait | None = None
    spawns: Spawn | None = None

    def __post_init__(self) -> None:
        if self.sleep is None:
            return
        seconds = self.sleep.total_seconds() if isinstance(self.sleep, dt.timedelta) else self.sleep
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"sleep={self.sleep!r}: give seconds >= 0 or a timedelta")
        if self.waits_for is not None:
            raise ValueError(
                "a step sleeps or waits, not both: a wait's timeout= is a sleep a signal ends"
            )
        if self.cursor == DONE:
            raise ValueError("sleep before 'done' has nothing to wake for: sleep, then end")
        # A sleep is a wait for no event: the same parking, wake and cancel as a wait's.
        object.__setattr__(self, "waits_for", Wait(event=None, timeout=float(seconds)))

    @classmethod
    def wait(
        cls,
        event: str,
        *,
        cursor: str,
        timeout: float | None = None,
        on_timeout: str | None = None,
        state: Mapping[str, Any] | None = None,
        window: list[dict[str, Any]] | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> StepResult:
        """Park the run until a signal of `event` arrives; then the step `cursor` runs and
        finds it in ctx.signal. No worker holds a waiting run. With timeout (seconds), the
        run goes on at on_timeout (default: cursor, with ctx.signal None) if no signal
        came first. A signal sent before the run waits is kept for it.

        With request (JSON: {"tool": name, "args": {...}, "prompt": "..."}, any keys) the
        wait is an approval: listed across runs (Client.approvals, GET /approvals, the
        approvals page) until someone decides it (Client.decide), whose signal is
        {"decision": "approve" | "deny" | "edit", "args": ..., "approval_id": ...}; a
        standing rule for its workflow and tool approves it as the run saves."""
        return cls(
            cursor=cursor,
            state=state or {},
            window=window,
            waits_for=Wait(
                event=event,
                timeout=timeout,
                on_timeout=on_timeout or cursor,
                request=_request(request),
            ),
        )

    @classmethod
    def spawn(
        cls,
        children: Iterable[Child],
        *,
        cursor: str,
        wait: str | int = "all",
        timeout: float | None = None,
        on_timeout: str | None = None,
        state: Mapping[str, Any] | None = None,
        window: list[dict[str, Any]] | None = None,
    ) -> StepResult:
        """Start child runs, created with this step's save (exactly once: a replay of the
        step spawns nothing more), and park the run, holding no worker, until `wait` of
        them have stopped: "all", "any", or a number. Then the step `cursor` runs and reads
        them with ctx.children(). With timeout (seconds) it goes on at on_timeout (default:
        cursor) if they take longer. Cancelling the run cancels its children."""
        kids = tuple(children)
        if not kids or len(kids) > MAX_CHILDREN:
            raise ValueError(f"spawn wants 1 to {MAX_CHILDREN:,} children, got {len(kids):,}")
        keys = [c.key if c.key is not None else str(i) for i, c in enumerate(kids)]
        for c, key in zip(kids, keys, strict=True):
            if not isinstance(c, Child):
                raise TypeError(f"spawn wants cairn.Child items, got {type(c).__name__}")
            if not _CHILD_KEY.fullmatch(key):
                raise ValueError(f"child key {key!r}: 1-64 letters, digits, '_' or '-'")
        if len(set(keys)) != len(keys):
            raise ValueError("two children of one spawn have the same key")
        need = {"all": len(kids), "any": 1}.get(wait, wait) if isinstance(wait, str) else wait
        if isinstance(need, str | bool) or not 1 <= need <= len(kids):
            raise ValueError(f'spawn wait={wait!r}: "all", "any" or 1..{len(kids)} children')
        return cls(
            cursor=cursor,
            state=state or {},
            window=window,
            # The event names the spawn (its save's seq), set by the loop when it saves.
            waits_for=Wait(
                event="cairn.children", timeout=timeout, on_timeout=on_timeout or cursor
            ),
            spawns=Spawn(kids, need),
        )


def _request(request: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """An approval's request as the wait stores it; a mistake is the step's error."""
    if request is None:
        return None
    if not isinstance(request, Mapping):
        raise TypeError(f"wait request= wants a dict, got {type(request).__name__}")
    tool = request.get("tool")
    if tool is not None and not (isinstance(tool, str) and 0 < len(tool) <= 200):
        raise ValueError(f"wait request: 'tool' is a name of 1-200 characters, not {tool!r:.50}")
    return dict(request)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Retry:
    """How a step's failures are retried. Attempts are counted in the checkpoint, so a
    crash does not reset them; when they are spent the run fails "retries exhausted".

    attempts: tries in all, the first included. backoff: seconds before the first retry,
    doubling each time up to max_backoff. on: the exceptions worth a retry (the default,
    cairn.Transient, covers a model API that stays overloaded); anything else fails the
    run at once.
    """

    attempts: int = 5
    backoff: float = 2.0
    max_backoff: float = 60.0
    on: tuple[type[BaseException], ...] = (Transient,)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("Retry wants attempts >= 1 and backoffs >= 0")

    def delay(self, failed: int) -> float:
        """Seconds to wait after the failed-th failed attempt."""
        return float(min(self.backoff * 2 ** max(failed - 1, 0), self.max_backoff))


class StepFn(Protocol):
    """A step: a function, or a coroutine function, of the run's Context."""

    def __call__(self, ctx: Context) -> StepResult | Coroutine[Any, Any, StepResult]: ...


S = TypeVar("S", bound=StepFn)  # the decorated step keeps its own type

Validator = Callable[[dict[str, Any]], dict[str, Any]]
Migration = Callable[[dict[str, Any]], dict[str, Any]]


VERSION_POLICIES = ("upgrade", "pin")


class Workflow:
    """A named set of steps. The first step registered is where a run starts."""

    def __init__(
        self,
        name: str,
        *,
        validate: Validator | None = None,
        max_steps: int = 1000,
        version: int = 1,
        priority: int = 0,
        concurrency_limit: int = 1,
        renamed: Mapping[str, str] | None = None,
        versions: str = "upgrade",
    ) -> None:
        from cairn.core.inputs import check_flow

        self.name = name
        # A deploy's policy for runs under way: "upgrade", the new code goes on at the
        # next step boundary; "pin", a run goes on only on workers of the code version
        # (CAIRN_CODE_VERSION) that started it, sent to that version's queue.
        if versions not in VERSION_POLICIES:
            raise ValueError(
                f"workflow {name!r}: versions={versions!r}; use one of {', '.join(VERSION_POLICIES)}"
            )
        self.versions = versions
        # Defaults for an enqueue that does not say (by a Client that has this workflow
        # registered): its priority, and its runs per concurrency key at a time.
        try:
            _, self.concurrency_limit, self.priority = check_flow(None, concurrency_limit, priority)
        except InvalidInput as exc:
            raise ValueError(f"workflow {name!r}: {exc}") from None
        # The shape of this workflow's state. Bump it when a change would not read the
        # state older runs saved, and register a migration from the previous version.
        self.version = version
        self.migrations: dict[int, Migration] = {}
        self.steps: dict[str, StepFn] = {}
        self.retries: dict[str, Retry] = {}
        self.first: str | None = None
        self._validate = validate
        self.max_steps = max_steps  # an agent loop that never says "done" fails, loudly
        # Old step name -> new: a run saved at (or waiting to go on at) an old name goes on
        # at the new one, so a deploy that renames a step strands no run.
        self.renamed = dict(renamed or {})
        for old, new in self.renamed.items():
            if not (isinstance(old, str) and isinstance(new, str)) or old == new:
                raise ValueError(f"workflow {name!r}: renamed wants {{'old': 'new'}} names")

    def step(self, name: str | None = None, *, retry: Retry | None = None) -> Callable[[S], S]:
        """Register a step: `@flow.step()` uses the function's name as the cursor.

        retry: how its failures are retried (default: Retry(), which retries
        cairn.Transient 5 times in all with backoff)."""

        def register(fn: S) -> S:
            cursor = name or fn.__name__  # type: ignore[attr-defined]
            if not _STEP_NAME.fullmatch(cursor):
                # The name goes into idempotency keys, which travel in HTTP headers.
                raise ValueError(f"step name {cursor!r}: use ASCII letters, digits, . _ -")
            if cursor == DONE:
                raise ValueError(f"{DONE!r} is reserved: it ends the run")
            if cursor in self.steps:
                raise ValueError(f"workflow {self.name!r} already has a step {cursor!r}")
            self.steps[cursor] = fn
            self.retries[cursor] = retry or Retry()
            self.first = self.first or cursor
            return fn

        return register

    def current(self, cursor: str) -> str:
        """The step's name now: cursor, or what it was renamed to (a chain followed)."""
        seen = {cursor}
        while cursor in self.renamed and cursor not in self.steps:
            cursor = self.renamed[cursor]
            if cursor in seen:
                break  # a cycle of renames: the run stops as incompatible at the step
            seen.add(cursor)
        return cursor

    def missing(self, cursors: Iterable[str]) -> list[str]:
        """The cursors (of live runs) this code has no step for, renames followed."""
        return sorted(
            {c for c in cursors if c not in ("", DONE) and self.current(c) not in self.steps}
        )

    def migration(self, *, from_version: int) -> Callable[[Migration], Migration]:
        """Register fn(state) -> state, upgrading a run saved at from_version to the next
        version. A worker applies the chain when it loads an older run."""

        def register(fn: Migration) -> Migration:
            if not 1 <= from_version < self.version:
                raise ValueError(
                    f"workflow {self.name!r} is version {self.version}: a migration goes from "
                    f"1..{self.version - 1}, not {from_version}"
                )
            self.migrations[from_version] = fn
            return fn

        return register

    def upgrade(self, state: dict[str, Any], saved_at: int) -> dict[str, Any] | None:
        """state upgraded from version saved_at to self.version; None if a migration on
        the way is missing (or saved_at is newer than this code)."""
        for version in range(saved_at, self.version):
            migrate = self.migrations.get(version)
            if migrate is None:
                return None
            state = migrate(dict(state))
        return state if saved_at <= self.version else None

    def validate(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise InvalidInput(f"workflow {self.name!r}: input must be a JSON object")
        if self._validate is None:
            return data
        try:
            return self._validate(data)
        except InvalidInput:
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidInput(f"workflow {self.name!r}: invalid input: {exc}") from exc


_REGISTRY: dict[str, Workflow] = {}
_ORIGIN: dict[str, str] = {}  # name -> the CAIRN_WORKFLOWS module that registered it


def workflow(name: str, **options: Any) -> Workflow:
    """Create and register a workflow under name."""
    if name in _REGISTRY:
        where = f" by {_ORIGIN[name]}" if name in _ORIGIN else ""
        raise ValueError(
            f"a workflow named {name!r} is already registered{where}: names are unique "
            "in a process, so rename one of them"
        )
    flow = Workflow(name, **options)
    _REGISTRY[name] = flow
    return flow


def pinned() -> list[str]:
    """The workflows registered here with versions="pin", sorted: a worker's claim pins
    the runs of these it starts."""
    return sorted(name for name, flow in _REGISTRY.items() if flow.versions == "pin")


def find(name: str) -> Workflow | None:
    """The workflow registered under name in this process, if any."""
    return _REGISTRY.get(name)


def names() -> list[str]:
    """The names of the workflows registered in this process, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> Workflow:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownWorkflow(
            f"unknown workflow {name!r} (registered: {known}); "
            "add its module to CAIRN_WORKFLOWS on the workers and the enqueuer"
        ) from None


def code_version(configured: str | None = None) -> str:
    """The code version a worker states (CAIRN_CODE_VERSION): configured, or else a short
    hash of this process's registered workflows: each workflow's name (sorted) with its
    steps' names in the order they were registered (the first is where a run starts).

    The hash changes when a workflow or a step is added, removed or renamed, and only then:
    a change inside a step's code (a reordered call) keeps it, which is why a deploy should
    state its version (a release tag, a commit)."""
    if configured:
        return configured
    lines = [f"{name}:{','.join(_REGISTRY[name].steps)}" for name in sorted(_REGISTRY)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def import_modules(modules: Iterable[str]) -> None:
    """Import the modules named in CAIRN_WORKFLOWS so their workflows register.

    The current folder is searched first, as `python -m` and `celery -A` do: a console
    script (`cairn worker`) has only its own bin folder on sys.path, so `mypkg` next to
    where the command runs would not be found."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    for module in modules:
        before = set(_REGISTRY)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UnknownWorkflow(
                f"CAIRN_WORKFLOWS names {module!r}, which cannot be imported: {exc}"
                + _import_hint(module, exc)
            ) from exc
        except Exception as exc:  # the module's own code: a duplicate name, a typo
            raise UnknownWorkflow(
                f"CAIRN_WORKFLOWS names {module!r}, which failed as it was imported: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        # Who registered each name, for the error of a second module taking it.
        _ORIGIN.update(dict.fromkeys(set(_REGISTRY) - before, module))


def _import_hint(module: str, exc: ImportError) -> str:
    if exc.name is None:  # a name the module imports from another is missing
        return ""
    if f"{module}.".startswith(f"{exc.name}."):
        return "; run from the folder that holds it, or add that folder to PYTHONPATH"
    return f"; install {exc.name.split('.')[0]!r} where this runs, or fix the module's import"
