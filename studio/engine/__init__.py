"""engine: loads pipelines, applies the speed stack in its fixed order, measures runs and pairs them with their base,
behind one facade (runner.Runner). Imports `measure` and `spec` from the studio, nothing above."""

from studio.engine.baseline import CALLER_TIMES_BASE, Pairing
from studio.engine.loader import ModelLoadError, ModelManager
from studio.engine.runner import BASE, RunError, Runner, RunResult
from studio.engine.stack import STACK_ORDER
from studio.engine.state import stack_state

__all__ = [
    "BASE",
    "CALLER_TIMES_BASE",
    "Pairing",
    "STACK_ORDER",
    "ModelLoadError",
    "ModelManager",
    "RunError",
    "RunResult",
    "Runner",
    "stack_state",
]
