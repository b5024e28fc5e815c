"""Benchmarks: the preset matrix (UI), the bench with its noise floor and costs, the knob sweep, the tuner."""
