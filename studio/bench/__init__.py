"""bench: the preset matrix and the threshold sweep, measured side by side through the engine."""

from studio.bench.matrix import run_matrix, threshold_sweep

__all__ = ["run_matrix", "threshold_sweep"]
