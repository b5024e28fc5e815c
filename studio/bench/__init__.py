"""Benchmarks: the preset matrix (UI), the bench with its noise floor and costs, the knob sweep, the tuner.

`run_matrix` is loaded on first use: the app's process imports `studio.bench.records` (the tuner's result as data)
without the engine under it.
"""

__all__ = ["run_matrix"]


def __getattr__(name: str):
    if name == "run_matrix":
        from studio.bench.matrix import run_matrix

        return run_matrix
    raise AttributeError(f"module 'studio.bench' has no attribute {name!r}")
