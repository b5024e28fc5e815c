"""engine: loads pipelines (loader), applies the speed stack in its fixed order (stack: quantize, cache,
attention, compile; one typed StackState per transformer), and measures one run against its base (session).

Imports `measure` and `spec` from the studio, nothing above.
"""

from studio.engine.loader import ModelLoadError, ModelManager
from studio.engine.session import BASE, RunError, Runner, RunResult
from studio.engine.stack import STACK_ORDER, AppliedStack, apply_preset
from studio.engine.state import Engaged, StackState, stack_state

__all__ = [
    "BASE",
    "STACK_ORDER",
    "AppliedStack",
    "Engaged",
    "ModelLoadError",
    "ModelManager",
    "RunError",
    "RunResult",
    "Runner",
    "StackState",
    "apply_preset",
    "stack_state",
]
