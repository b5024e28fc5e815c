"""Where the studio is hosted (no torch: the app's process asks before anything loads)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from studio.spec.settings import current

ROOT = str(Path(__file__).resolve().parents[2])  # the folder `studio` is in (the edges put it on PYTHONPATH)


def edge_environ(env: Mapping[str, str]) -> dict[str, str]:
    """What an edge (app.py, the CLI, the tests' conftest) sets in its own environment before anything loads, for it
    and the processes it starts (the device worker, a local Ray, the vs-raw child) to inherit: cache-dit's log level
    (it logs every hook to stdout, the CLI's --json, unless told) and the studio's folder first on PYTHONPATH (a
    child started with `python -m studio...` imports this same studio)."""
    return {
        "CACHE_DIT_LOG_LEVEL": env.get("CACHE_DIT_LOG_LEVEL") or "error",
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p),
    }


def on_zerogpu() -> bool:
    """ZeroGPU Spaces (`spaces` installed and SPACES_ZERO_GPU set): the GPU is attached per call to a process that
    `spaces` forks for the handler, and run-time compilation is not available."""
    return current().zerogpu
