"""engine: loads pipelines (loader), applies the speed stack in its fixed order (stack: quantize, offload, cache,
attention, compile, parallel; one typed StackState per transformer), calls the pipeline (call), measures one run
(run), pairs it with its base (baseline: the measuring method), behind one facade (runner.Runner).

Imports `measure` and `spec` from the studio, nothing above.
"""

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
