"""The step API: workflows, their named steps, the registry, and step results."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from cairn.errors import InvalidInput, UnknownWorkflow

if TYPE_CHECKING:
    from cairn.steps.context import Context

DONE = "done"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepResult:
    """What a step returns: where to go next and what changed.

    cursor: the next step's name, or "done".
    state: keys merged into the run's state.
    window: the new model window (None leaves it as it was).
    cost_usd: cost not already counted by ctx.model (ctx.model counts its own calls).
    """

    cursor: str
    state: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    window: list[dict[str, Any]] | None = None
    cost_usd: float = 0.0


class StepFn(Protocol):
    def __call__(self, ctx: Context) -> StepResult: ...


Validator = Callable[[dict[str, Any]], dict[str, Any]]


class Workflow:
    """A named set of steps. The first step registered is where a run starts."""

    def __init__(
        self, name: str, *, validate: Validator | None = None, max_steps: int = 1000
    ) -> None:
        self.name = name
        self.steps: dict[str, StepFn] = {}
        self.first: str | None = None
        self._validate = validate
        self.max_steps = max_steps  # an agent loop that never says "done" fails, loudly

    def step(self, name: str | None = None) -> Callable[[StepFn], StepFn]:
        """Register a step: `@flow.step()` uses the function's name as the cursor."""

        def register(fn: StepFn) -> StepFn:
            cursor = name or fn.__name__  # type: ignore[attr-defined]
            if cursor == DONE:
                raise ValueError(f"{DONE!r} is reserved: it ends the run")
            if cursor in self.steps:
                raise ValueError(f"workflow {self.name!r} already has a step {cursor!r}")
            self.steps[cursor] = fn
            self.first = self.first or cursor
            return fn

        return register

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


def workflow(name: str, **options: Any) -> Workflow:
    """Create and register a workflow under name."""
    if name in _REGISTRY:
        raise ValueError(f"a workflow named {name!r} is already registered")
    flow = Workflow(name, **options)
    _REGISTRY[name] = flow
    return flow


def find(name: str) -> Workflow | None:
    """The workflow registered under name in this process, if any."""
    return _REGISTRY.get(name)


def get(name: str) -> Workflow:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownWorkflow(
            f"unknown workflow {name!r} (registered: {known}); "
            "add its module to CAIRN_WORKFLOWS on the workers and the enqueuer"
        ) from None


def import_modules(modules: Iterable[str]) -> None:
    """Import the modules named in CAIRN_WORKFLOWS so their workflows register."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise UnknownWorkflow(
                f"CAIRN_WORKFLOWS names {module!r}, which cannot be imported: {exc}"
            ) from exc
