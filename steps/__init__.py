"""The step API: write a workflow as named steps, each returning the next cursor.

from cairn.steps import StepResult, workflow

flow = workflow("greet")

@flow.step()
def hello(ctx):
    return StepResult(cursor="done", state={"greeted": ctx.input["name"]})
"""

from cairn.steps.context import Context
from cairn.steps.registry import DONE, StepResult, Workflow, get, workflow

__all__ = ["DONE", "Context", "StepResult", "Workflow", "get", "workflow"]
