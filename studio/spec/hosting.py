"""Where the studio is hosted, read from the environment (no torch: the app's process asks before anything loads)."""

from __future__ import annotations

import importlib.util
import os


def on_zerogpu() -> bool:
    """ZeroGPU Spaces (`spaces` installed and SPACES_ZERO_GPU set): the GPU is attached per call to a process that
    `spaces` forks for the handler, and run-time compilation is not available."""
    return importlib.util.find_spec("spaces") is not None and os.environ.get("SPACES_ZERO_GPU", "") not in ("", "0")
