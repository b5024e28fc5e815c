"""Where the studio is hosted, read from the environment (no torch: the app's process asks before anything loads)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])  # the folder `studio` is in


def child_env() -> dict:
    """This process's environment with the studio's folder first on PYTHONPATH: a child process started with
    `python -m studio...` (the device worker, the doctor's and the bench's children) imports this same studio."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def on_zerogpu() -> bool:
    """ZeroGPU Spaces (`spaces` installed and SPACES_ZERO_GPU set): the GPU is attached per call to a process that
    `spaces` forks for the handler, and run-time compilation is not available."""
    return importlib.util.find_spec("spaces") is not None and os.environ.get("SPACES_ZERO_GPU", "") not in ("", "0")
