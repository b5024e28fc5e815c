"""Benchmarks: the preset matrix (UI), the bench with its noise floor and costs, the knob sweep, the tuner."""

from studio.bench.matrix import run_matrix

__all__ = ["run_matrix"]
