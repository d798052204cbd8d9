"""Hooks the loop calls at a step's boundaries (dramatiq's middleware, in small).

The default does nothing. `cairn chaos` passes one that SIGKILLs the worker at chosen
boundaries (cairn.testing.faults); metrics or tracing could be others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cairn.store import Checkpoint


class StepHooks:
    """Subclass and override what you need; each gets the checkpoint the step starts from."""

    def before_step(self, cp: Checkpoint) -> None:
        """The lease was checked; the step function is about to run."""

    def after_effect(self, cp: Checkpoint) -> None:
        """The step function returned; its checkpoint is not saved yet."""

    def after_save(self, cp: Checkpoint) -> None:
        """The step's checkpoint is saved."""


NO_HOOKS = StepHooks()
