"""torch.compile, last in the stack: regional (repeated blocks) where the model has them.

fullgraph must be False whenever a step cache is engaged: caches branch on runtime values (a residual diff
against a threshold) and call torch.compiler.disable()d code, which a full graph cannot hold.
"""

from __future__ import annotations

import importlib.util
import os

from studio.config import CompileSpec
from studio.optimize.engaged import Engaged
from studio.timing import COMPILE_MARK


def on_zerogpu() -> bool:
    """ZeroGPU Spaces: the GPU is attached per call, so run-time compilation is not available."""
    return importlib.util.find_spec("spaces") is not None and os.environ.get("SPACES_ZERO_GPU", "") not in ("", "0")


def effective_fullgraph(spec: CompileSpec, cache_engaged: bool) -> bool:
    if cache_engaged:
        return False
    return True if spec.fullgraph is None else spec.fullgraph


def apply_compile(pipe, spec: CompileSpec, *, cache_engaged: bool) -> Engaged:
    if not spec.enabled:
        return Engaged("compile", "off", False, "compile: off (eager)")
    if on_zerogpu():
        return Engaged(
            "compile", "on", False, "compile: skipped, torch.compile at run time is not available on ZeroGPU"
        )
    tr = pipe.transformer
    if getattr(tr, COMPILE_MARK, None) is not None:
        return Engaged("compile", "on", True, f"compile: already compiled ({getattr(tr, COMPILE_MARK)})")
    fullgraph = effective_fullgraph(spec, cache_engaged)
    note = " (fullgraph off: a step cache is engaged)" if cache_engaged and spec.fullgraph is not False else ""
    kwargs = {"fullgraph": fullgraph, "mode": None if spec.mode == "default" else spec.mode, "dynamic": spec.dynamic}
    if spec.regional and getattr(tr, "_repeated_blocks", None):
        tr.compile_repeated_blocks(**kwargs)
        how = f"regional ({', '.join(tr._repeated_blocks)})"
    else:
        tr.compile(**kwargs)
        how = "whole transformer"
    desc = f"{how}, fullgraph={fullgraph}, mode={spec.mode}"
    setattr(tr, COMPILE_MARK, desc)
    return Engaged("compile", "on", True, f"compile: {desc}{note}")
